"""A damaged, evicted, full or hostile cache or input is repaired, rebuilt or refused in
one line: never a traceback, never a corrupt output reported as built."""

import json
import os
import resource
import signal
import subprocess
import sys
import time

import pytest

from qbuild.core.files import hash_file
from qbuild.store.local import LocalStore


def _damage(path):
    """Flip the bytes of a file in place, keeping its size (as bit rot would)."""
    os.chmod(path, 0o644)
    data = path.read_bytes()
    path.write_bytes(bytes(b ^ 0xFF for b in data))


def test_every_damaged_blob_of_a_target_is_detected_and_restored(ws):
    ws.write("p/BUILD.toml", '[t]\nrule = "tree"\nn = 3\n')
    assert ws.build("//p:t").ok
    files = sorted(ws.path("qbuild-out/p/@t/data").iterdir())
    for path in files[:2]:  # two damaged blobs (outputs share the blob's inode)
        _damage(path)
    again = ws.build("//p:t")
    assert again.ok, again.error
    assert [p.read_text() for p in sorted(ws.path("qbuild-out/p/@t/data").iterdir())] == \
        ["0", "1", "2"]


def test_put_blob_repairs_a_damaged_stored_copy(tmp_path):
    source = tmp_path / "f"
    source.write_bytes(b"content" * 100)
    digest = hash_file(source)
    store = LocalStore(tmp_path / "cache")
    store.put_blob(source, digest)
    stored = store._blob_path(digest)
    _damage(stored)
    store.put_blob(source, digest)
    assert hash_file(store._blob_path(digest)) == digest
    assert not os.stat(store._blob_path(digest)).st_mode & 0o222  # never left writable
    store.close()


def test_a_target_with_many_evicted_inputs_rebuilds_them_all(ws):
    ws.write("p/BUILD.toml", "".join(
        f'[i{n}]\nrule = "concat"\nsrcs = ["{n}.txt"]\n\n' for n in range(4))
        + '[d]\nrule = "concat"\ndeps = [":i0", ":i1", ":i2", ":i3"]\n')
    for n in range(4):
        ws.write(f"p/{n}.txt", str(n))
    assert ws.build("//p:d").ok
    store = LocalStore(ws.cache_dir)
    store.gc(0)
    store.close()
    ws.write("p/BUILD.toml", ws.path("p/BUILD.toml").read_text() + 'sep = "-"\n')
    result = ws.build("//p:d")
    assert result.ok, result.error
    assert ws.path("qbuild-out/p/@d/out.txt").read_text() == "0-1-2-3"


def test_gc_reclaims_orphan_blob_files_left_by_a_killed_process(ws):
    ws.write("p/a.txt", "a")
    ws.write("p/BUILD.toml", '[c]\nrule = "concat"\nsrcs = ["a.txt"]\n')
    assert ws.build("//p:c").ok
    orphan = ws.cache_dir / "cas" / "ab" / "cd" / "0123456789abcdef.val"
    orphan.parent.mkdir(parents=True, exist_ok=True)
    orphan.write_bytes(b"x" * 1000)
    old = time.time() - 3600
    os.utime(orphan, (old, old))
    store = LocalStore(ws.cache_dir)
    outcome = store.gc(10**9)
    store.close()
    assert not orphan.exists() and outcome["orphans"] == 1
    assert ws.build("//p:c").ok  # what is indexed is untouched


def _cmd_target(ws):
    ws.write("p/a.txt", "a\n")
    ws.write("p/BUILD.toml", '[c]\nrule = "command"\nsrcs = ["a.txt"]\nouts = ["o"]\n'
             'cmd = "cat $(SRCS) > $(OUT)"\n')


def _one_line(result, code):
    assert result.code == code, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("index", ["ac", "cas", "memo"])
def test_a_damaged_sqlite_index_is_rebuilt_with_one_message(ws, index):
    _cmd_target(ws)
    _one_line(ws.cli("build", "//p:c"), 0)
    db = ws.cache_dir / index / "cache.db"
    db.write_bytes(b"this is not a database" * 200)
    ws.path("qbuild-out").joinpath(".qbuild", "noop").mkdir(parents=True, exist_ok=True)
    result = ws.cli("build", "--explain", "//p:c")
    _one_line(result, 0)
    assert "damaged" in result.stderr
    assert ws.path("qbuild-out/p/@c/o").read_text() == "a\n"
    _one_line(ws.cli("build", "--explain", "//p:c"), 0)



@pytest.mark.parametrize("index", ["ac", "cas", "memo"])
@pytest.mark.parametrize("damage", ["database is a folder", "index is a file"])
def test_a_cache_index_of_the_wrong_kind_is_rebuilt_with_one_message(ws, index, damage):
    import shutil

    _cmd_target(ws)
    _one_line(ws.cli("build", "//p:c"), 0)
    folder = ws.cache_dir / index
    if damage == "database is a folder":
        for name in ("cache.db", "cache.db-wal", "cache.db-shm"):
            (folder / name).unlink(missing_ok=True)
        (folder / "cache.db").mkdir()
    else:
        shutil.rmtree(folder)
        folder.write_text("not an index")
    shutil.rmtree(ws.path("qbuild-out"))
    healed = ws.cli("build", "//p:c")
    _one_line(healed, 0)
    assert "damaged" in healed.stderr and "rebuilt" in healed.stderr, healed.stderr
    assert ws.path("qbuild-out/p/@c/o").read_text() == "a\n"
    ws.cli("clean")
    again = ws.cli("build", "//p:c")
    _one_line(again, 0)
    assert "damaged" not in again.stderr and "1 cache hits" in again.stderr, again.stderr

def test_cache_entries_of_the_wrong_shape_are_misses(ws):
    import diskcache

    _cmd_target(ws)
    _one_line(ws.cli("build", "//p:c"), 0)
    state = ws.path("qbuild-out/.qbuild/state.json")
    (key,) = json.loads(state.read_text())["last_keys"].values()
    for name, value in (("ac", json.dumps([1, 2])), ("memo", 42)):
        cache = diskcache.Cache(str(ws.cache_dir / name))
        for k in list(cache.iterkeys()):
            cache.set(k, value)
        cache.set(key, value)
        cache.close()
    state.write_text('{"last_keys": [1], "materialized": {"p/c/o": 5}}')
    ws.path("qbuild-out/.qbuild/noop").mkdir(exist_ok=True)
    for snapshot in ws.path("qbuild-out/.qbuild/noop").iterdir():
        snapshot.write_text('{"environment": 1, "files": []}')
    result = ws.cli("build", "//p:c")
    _one_line(result, 0)
    assert "1 actions run" in result.stderr
    _one_line(ws.cli("explain", "//p:c"), 0)


def test_a_write_error_in_the_store_is_one_line(ws):
    ws.write_bytes("p/big.bin", b"\0" * (3 << 20))
    ws.write("p/BUILD.toml", '[c]\nrule = "command"\nsrcs = ["big.bin"]\nouts = ["o"]\n'
             'cmd = "ln -L $(SRCS) $(OUT) 2>/dev/null || cp $(SRCS) $(OUT)"\n')

    def limit():  # files over 1 MiB cannot be written, as on a full disk
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))

    env = dict(os.environ)
    env.pop("QBUILD_CACHE_DIR", None)
    proc = subprocess.run([sys.executable, "-m", "qbuild", "build", "//p:c"], cwd=ws.root,
                          capture_output=True, text=True, preexec_fn=limit, env=env)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "File too large" in proc.stderr


@pytest.mark.non_root
@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores read-only modes")
def test_a_read_only_cache_is_one_line(ws):
    _cmd_target(ws)
    ws.cache_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(ws.cache_dir, 0o555)
    try:
        result = ws.cli("build", "//p:c")
        assert result.code in (1, 2) and "Traceback" not in result.stderr, result.stderr
    finally:
        os.chmod(ws.cache_dir, 0o755)


@pytest.mark.parametrize("setting", ["cache_dir", "output_dir"])
def test_a_setting_pointing_at_a_file_is_one_line(ws, setting):
    _cmd_target(ws)
    ws.write("afile", "x")
    text = f'[settings]\n{setting} = "afile"\n'
    if setting == "output_dir":
        text += f'cache_dir = "{ws.cache_dir.as_posix()}"\n'
    ws.write("qbuild.toml", text)
    result = ws.cli("build", "//p:c")
    _one_line(result, 2)
    assert setting in result.stderr and "not a folder" in result.stderr


def test_hostile_names_nesting_and_matrices_are_refused_in_one_line(ws):
    long_name = "n" * 300
    cases = {
        f'[{long_name}]\nrule = "command"\nouts = ["o"]\ncmd = "true"\n': "255",
        'x = ' + "[" * 600 + "]" * 600 + "\n": "nested too deeply",
        '[m]\nrule = "command"\nouts = ["o"]\ncmd = "true"\nmatrix = { a = ' +
        str(list(range(200))) + ', b = ' + str(list(range(200))) + ', c = ' +
        str(list(range(200))) + ' }\n': "at most 10000",
        '[d]\nrule = "command"\nouts = ["."]\ncmd = "true"\n': "bad or duplicate output",
        '[d]\nrule = "command"\nouts = ["a\\u0000b"]\ncmd = "true"\n': "NUL",
        '[d]\nrule = "command"\nsrcs = ["a\\u0000.txt"]\nouts = ["o"]\ncmd = "true"\n':
            "NUL",
        '["a\\u0000b"]\nrule = "command"\nouts = ["o"]\ncmd = "true"\n': "bad target name",
    }
    for text, says in cases.items():
        ws.write("p/BUILD.toml", text)
        result = ws.cli("build", "//p:all")
        _one_line(result, 2)
        assert says in result.stderr, (text[:60], result.stderr)
    query = ws.cli("query", "(" * 600 + "//p:all" + ")" * 600)
    _one_line(query, 2)


RACER = """
import sys, time
from pathlib import Path
from qbuild.store.local import LocalStore
from qbuild.core.files import hash_file
cache, role, data = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
store = LocalStore(cache)
digest = hash_file(data)
deadline = time.monotonic() + 3
n = 0
while time.monotonic() < deadline:
    if role == "gc":
        store.gc(0)
    else:
        store.put_blob(data, digest)
        dest = data.parent / f"out-{role}"
        if store.restore_blob(digest, dest):
            assert hash_file(dest) == digest
    n += 1
print(n)
"""


def test_gc_and_concurrent_puts_of_one_digest_never_crash(tmp_path):
    data = tmp_path / "data.bin"
    data.write_bytes(os.urandom(200_000))
    cache = tmp_path / "cache"
    LocalStore(cache).close()
    procs = [subprocess.Popen([sys.executable, "-c", RACER, str(cache), role, str(data)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for role in ("gc", "a", "b")]
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert int(out) > 0


@pytest.mark.parametrize("text", [
    '[c]\nrule = "filegroup"\nsrcs = ["{name}"]\n',
    '[c]\nrule = "command"\nsrcs = ["{name}"]\nouts = ["o"]\ncmd = "true"\n',
    '[c]\nrule = "onnx_model"\nsrc = "{name}"\n',
])
def test_a_source_name_over_255_bytes_is_one_line_naming_file_target_attribute(ws, text):
    ws.write("p/BUILD.toml", text.format(name="s" * 300 + ".onnx"))
    result = ws.cli("build", "//p:c")
    _one_line(result, 2)
    assert "255 bytes" in result.stderr and "//p:c" in result.stderr, result.stderr
    assert "BUILD.toml" in result.stderr and "src" in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.parametrize("path", ["../../../escape.txt", "/ESCAPE", "sub/../../../x.txt",
                                  "./o"])
def test_a_local_entry_naming_a_path_outside_the_output_folder_is_a_miss(
        ws, tmp_path, path):
    import diskcache

    path = path.replace("/ESCAPE", str(tmp_path / "escape.txt"))
    _cmd_target(ws)
    _one_line(ws.cli("build", "//p:c"), 0)
    state = ws.path("qbuild-out/.qbuild/state.json")
    (key,) = json.loads(state.read_text())["last_keys"].values()
    cache = diskcache.Cache(str(ws.cache_dir / "ac"))
    entry = json.loads(cache.get(key))
    entry["outputs"][0]["path"] = entry["declared"][0] = path
    cache.set(key, json.dumps(entry))  # as anyone who can write the cache folder can
    cache.close()
    ws.cli("clean")
    result = ws.cli("build", "//p:c")
    _one_line(result, 0)
    assert "1 actions run" in result.stderr, result.stderr
    assert "not a relative path inside the output folder" in result.stderr
    assert not list(ws.root.rglob("escape.txt")) and not (tmp_path / "escape.txt").exists()
    assert not ws.path("x.txt").exists() and not ws.path("qbuild-out/x.txt").exists()
    assert ws.path("qbuild-out/p/@c/o").read_text() == "a\n"
    again = ws.cli("build", "//p:c")  # the bad entry was replaced, not kept
    _one_line(again, 0)
    assert "warning" not in again.stderr


def test_placing_and_staging_refuse_a_path_outside_the_folder_whoever_hands_it_over(
        tmp_path):
    from qbuild.build.materialize import Materializer
    from qbuild.build.state import WorkspaceState
    from qbuild.core.labels import parse_label
    from qbuild.core.records import ActionResult, OutputEntry
    from qbuild.execution.actions import _stage_dep
    from qbuild.execution.failures import ActionFailed
    from qbuild.execution.sandbox import Sandboxes
    from qbuild.store.digests import SourceDigests

    source = tmp_path / "f"
    source.write_bytes(b"payload")
    digest = hash_file(source)
    store = LocalStore(tmp_path / "cache")
    store.put_blob(source, digest)
    out = tmp_path / "ws" / "qbuild-out"
    out.mkdir(parents=True)
    hostile = ActionResult((OutputEntry("../../../../owned.txt", digest, 7),),
                           ("../../../../owned.txt",))
    placer = Materializer(out, store, WorkspaceState(out), lambda label: hostile,
                          lambda label: False)
    with pytest.raises(ActionFailed, match="not a relative path"):
        placer.place(parse_label("//p:c"))
    sandboxes = Sandboxes(store, tmp_path / "ws", SourceDigests(store), 1)
    box = tmp_path / "box" / "in"
    with pytest.raises(ActionFailed, match="not a relative path"):
        _stage_dep(sandboxes, "//p:c", hostile, box, {})
    store.close()
    assert not list(tmp_path.rglob("owned.txt"))


@pytest.mark.parametrize("rule", ["command", "filegroup"])
def test_a_damaged_memo_digest_never_poisons_the_action_cache(ws, rule):
    import diskcache

    ws.write("p/a.txt", "a\n")
    ws.write("p/BUILD.toml", {
        "command": '[c]\nrule = "command"\nsrcs = ["a.txt"]\nouts = ["o"]\n'
                   'cmd = "cat $(SRCS) > $(OUT)"\n',
        "filegroup": '[c]\nrule = "filegroup"\nsrcs = ["a.txt"]\n'}[rule])
    out = ws.path("qbuild-out/p/@c/" + ("o" if rule == "command" else "a.txt"))
    _one_line(ws.cli("build", "//p:c"), 0)
    ws.cli("clean")  # (also forgets this workspace's own record of digests)
    st = os.stat(ws.path("p/a.txt"))
    stat_key = f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"
    memo = diskcache.Cache(str(ws.cache_dir / "memo"))
    memo.set(stat_key, hash_file(ws.write("elsewhere", "b\n")))  # damage: b's digest
    memo.close()
    damaged = ws.cli("build", "//p:c")
    assert damaged.code in (0, 1) and "Traceback" not in damaged.stderr, damaged.stderr
    if damaged.code == 1:
        assert "a.txt" in damaged.stderr and len(damaged.stderr.splitlines()) <= 3
    healed = ws.cli("build", "//p:c")
    _one_line(healed, 0)
    assert out.read_text() == "a\n"
    ws.write("p/a.txt", "b\n")  # now a.txt really holds b: its output must say so
    _one_line(ws.cli("build", "//p:c"), 0)
    assert out.read_text() == "b\n"
