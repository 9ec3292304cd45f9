"""The no-op fast path vouches only for what the full path read, as it read it."""

import os
import shutil
import subprocess
import sys
import time


def _build(ws, *args, **kw):
    result = ws.cli("build", *args, **kw)
    assert result.code == 0, result.stderr
    return result


def _wait_for(path, proc, seconds=60):
    deadline = time.monotonic() + seconds
    while not os.path.exists(path):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.02)


def _start(ws, *args):
    env = dict(os.environ)
    env.pop("QBUILD_CACHE_DIR", None)
    return subprocess.Popen([sys.executable, "-m", "qbuild", "build", *args], cwd=ws.root,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def test_a_source_saved_during_the_build_is_picked_up_next_time(ws, tmp_path):
    marker, edited = tmp_path / "b_started", tmp_path / "edited"
    ws.write("p/a.txt", "old\n")
    ws.write("p/BUILD.toml", f"""
        [a]
        rule = "command"
        srcs = ["a.txt"]
        outs = ["a.out"]
        cmd = "cat $(SRCS) > $(OUT)"

        [b]
        rule = "command"
        srcs = [":a"]
        outs = ["b.out"]
        cmd = "touch {marker}; while [ ! -e {edited} ]; do sleep 0.02; done; cat $(SRCS) > $(OUT)"
    """)  # noqa: E501
    time.sleep(0.1)
    proc = _start(ws, "//p:a", "//p:b")
    try:
        _wait_for(marker, proc)  # :a has read a.txt and finished; :b is running
        ws.write("p/a.txt", "new\n")
    finally:
        edited.touch()  # :b ends only after the edit
    assert proc.wait(60) == 0, proc.communicate()
    again = _build(ws, "//p:a", "//p:b")
    assert "nothing changed" not in again.stderr
    assert ws.path("qbuild-out/p/@a/a.out").read_text() == "new\n"


def test_a_source_edited_and_reverted_while_its_action_runs_is_never_cached(ws, tmp_path):
    m = {i: tmp_path / f"m{i}" for i in range(1, 5)}
    ws.write("p/a.txt", "good\n")
    ws.write("p/BUILD.toml", f"""
        [a]
        rule = "command"
        srcs = ["a.txt"]
        outs = ["a.out"]
        cmd = "touch {m[1]}; while [ ! -e {m[2]} ]; do sleep 0.02; done; cat $(SRCS) > $(OUT); touch {m[3]}; while [ ! -e {m[4]} ]; do sleep 0.02; done"
    """)  # noqa: E501
    time.sleep(0.1)
    source = ws.path("p/a.txt")
    before = os.stat(source)
    proc = _start(ws, "//p:a")
    _wait_for(m[1], proc)
    source.write_text("BAD!\n")  # same size
    m[2].touch()
    _wait_for(m[3], proc)
    source.write_text("good\n")
    os.utime(source, ns=(before.st_atime_ns, before.st_mtime_ns))
    m[4].touch()
    proc.wait(60)
    assert ws.cli("clean").code == 0
    _build(ws, "//p:a")
    assert ws.path("qbuild-out/p/@a/a.out").read_text() == "good\n"


CAT_GLOB = """
[cat]
rule = "command"
srcs = ["{glob}"]
outs = ["all.txt"]
cmd = "cat $(SRCS) > $(OUT)"
"""


def test_new_matches_of_multi_segment_and_deep_globs_are_seen(ws):
    ws.write("p/d/a/x.txt", "a\n")
    ws.write("p/e/f/g.md", "g\n")
    ws.write("p/BUILD.toml", CAT_GLOB.format(glob="d/*/x.txt")
             + CAT_GLOB.replace("[cat]", "[deep]").format(glob="e/**/*.md"))
    time.sleep(0.1)
    _build(ws, "//p:all")
    assert "(nothing changed)" in _build(ws, "//p:all").stderr  # '**' globs too
    ws.write("p/d/b/x.txt", "b\n")  # a new match in a new directory
    assert "nothing changed" not in _build(ws, "//p:all").stderr
    assert ws.path("qbuild-out/p/@cat/all.txt").read_text() == "a\nb\n"
    ws.write("p/e/f/h/i/j.md", "j\n")
    assert "nothing changed" not in _build(ws, "//p:all").stderr
    assert ws.path("qbuild-out/p/@deep/all.txt").read_text() == "g\nj\n"


def test_removing_a_nested_workspace_marker_brings_its_packages_in(ws):
    ws.write("p/BUILD.toml", CAT_GLOB.format(glob="*.txt"))
    ws.write("p/a.txt", "a\n")
    ws.write("sub/qbuild.toml", "")
    ws.write("sub/BUILD.toml", CAT_GLOB.format(glob="*.txt"))
    ws.write("sub/s.txt", "s\n")
    time.sleep(0.1)
    first = _build(ws, "//...")
    assert "sub" not in first.stdout
    assert "(nothing changed)" in _build(ws, "//...").stderr
    ws.path("sub/qbuild.toml").unlink()
    second = _build(ws, "//...")
    assert "nothing changed" not in second.stderr
    assert "qbuild-out/sub/@cat/all.txt" in second.stdout


def test_a_copied_workspace_sees_its_own_edits(ws, tmp_path):
    # The console script, as a user runs it (``-m`` would put the folder on sys.path).
    script = os.path.join(os.path.dirname(sys.executable), "qbuild")

    def build(where):
        result = subprocess.run([script, "build", "//p:cat"], cwd=where, capture_output=True,
                                text=True)
        assert result.returncode == 0, result.stderr
        return result

    ws.write("p/BUILD.toml", CAT_GLOB.format(glob="*.txt"))
    ws.write("p/a.txt", "a\n")
    time.sleep(0.1)
    build(ws.root)
    assert "(nothing changed)" in build(ws.root).stderr
    copy = tmp_path / "copy"
    shutil.copytree(ws.root, copy)
    (copy / "p/a.txt").write_text("edited in the copy\n")
    assert "nothing changed" not in build(copy).stderr
    assert (copy / "qbuild-out/p/@cat/all.txt").read_text() == "edited in the copy\n"
    assert ws.path("qbuild-out/p/@cat/all.txt").read_text() == "a\n"


def test_timestamps_in_whole_seconds_mean_a_coarse_filesystem():
    from qbuild.core.files import granularity, is_racy

    whole = 1_700_000_000 * 10**9
    assert granularity(whole, whole) >= 1.0
    assert granularity(whole + 123_456, whole + 7) < 1.0
    # A digest of a file stamped 1.5 s ago on a 1-second filesystem must not be memoised:
    # a same-size edit in that second would keep every stat field.
    assert is_racy(whole, whole, since=whole / 1e9 + 1.5)
    assert not is_racy(whole, whole, since=whole / 1e9 + 3)
    assert is_racy(whole + 1, whole + 1, since=whole / 1e9 + 0.01)
    assert not is_racy(whole + 1, whole + 1, since=whole / 1e9 + 0.2)
