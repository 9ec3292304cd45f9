"""The engine's speed-ups never change an answer: each cache or shortcut added for
speed (issue 10, "Scale and I/O") is tried here with the edit that must defeat it."""

import os
import time


def _filegroup(ws):
    ws.write("p/a.txt", "a\n")
    ws.write("p/BUILD.toml", """
        [g]
        rule = "filegroup"
        srcs = ["a.txt"]
    """)


def test_full_path_keeps_placed_outputs(ws):
    """A build on the full path leaves outputs that are already in place alone (it used
    to forget where it had placed them and copy every output again)."""
    _filegroup(ws)
    first = ws.cli("build", "//p:g")
    assert first.code == 0, first.stderr
    out = ws.path("qbuild-out/p/@g/a.txt")
    before = os.stat(out)
    again = ws.cli("build", "--explain", "//p:g")
    assert again.code == 0, again.stderr
    after = os.stat(out)
    assert (after.st_ino, after.st_ctime_ns) == (before.st_ino, before.st_ctime_ns)
    assert out.read_text() == "a\n"


def test_sandboxes_are_gone_when_the_build_returns(ws):
    """Sandboxes are deleted in the background, but all of them before the build ends."""
    for i in range(6):
        ws.write(f"p/f{i}.txt", f"{i}\n")
    ws.write("p/BUILD.toml", "\n".join(
        f'[g{i}]\nrule = "filegroup"\nsrcs = ["f{i}.txt"]\n' for i in range(6)))
    result = ws.build("//p:all", jobs=2)
    assert result.ok, result.error
    assert sorted(os.listdir(ws.cache_dir / "tmp")) == []


def test_a_damaged_fresh_blob_is_still_caught(tmp_path):
    """A blob this process stored from a file it hashed is trusted (not hashed again
    when placed) only while it keeps the stat it was stored with."""
    from qbuild.core.files import hash_file
    from qbuild.store.local import LocalStore

    store = LocalStore(tmp_path / "cache")
    try:
        for damage in (False, True):
            out = store.tmp / f"out{damage}"
            out.write_bytes(b"x" * 1000 + bytes([damage]))
            st = os.stat(out)
            digest = hash_file(out)
            store.put_blob(out, digest, adopt=True, hashed=st)
            blob = store._blob_path(digest)
            if damage:
                os.chmod(blob, 0o644)
                with open(blob, "r+b") as handle:
                    handle.write(b"y")
            dest = tmp_path / f"placed{damage}"
            assert store.restore_blob(digest, dest) is not damage
            if not damage:
                assert hash_file(dest) == digest
    finally:
        store.close()


# -- the analysis cache (qbuild/_analysis_cache.py) ----------------------------------------

def _analysis_files(ws):
    folder = ws.path("qbuild-out/.qbuild/analysis")
    return {p.name: os.stat(p).st_ino for p in folder.iterdir()} if folder.is_dir() else {}


def _answer(ws, result):
    files = {}
    for line in result.stdout.split():
        path = ws.path(line)
        files[line] = path.read_bytes() if path.is_file() else None
    return result.code, files, [line for line in result.stderr.splitlines()
                                if line.startswith("ERROR")]


def _agrees(ws, *patterns):
    """Build with whatever analysis is cached, then with a fresh analysis: same answer.
    Returns whether the first build reused the cached analysis."""
    before = _analysis_files(ws)
    time.sleep(0.06)  # edits older than the racy window, so the cache may be written
    cached = ws.cli("build", *patterns)
    reused = bool(before) and _analysis_files(ws) == before
    for path in ws.path("qbuild-out/.qbuild/analysis").glob("*"):
        path.unlink()
    fresh = ws.cli("build", "--explain", *patterns)
    assert _answer(ws, cached) == _answer(ws, fresh), (cached.stderr, fresh.stderr)
    return reused


def test_analysis_cache_follows_every_edit_that_changes_analysis(ws):
    ws.write("p/BUILD.toml", """
        [cat]
        rule = "command"
        srcs = ["*.txt", "d/*/x.txt"]
        outs = ["all.txt"]
        cmd = "cat $(SRCS) > $(OUT)"
    """)
    ws.write("p/a.txt", "a\n")
    ws.write("p/d/a/x.txt", "x\n")
    ws.write("p/sub/BUILD.toml", '[s]\nrule = "filegroup"\nsrcs = ["s.txt"]\n')
    ws.write("p/sub/s.txt", "s\n")
    assert not _agrees(ws, "//...")  # nothing cached yet
    assert ws.cli("build", "//...").code == 0  # records it (fresh analysis before)
    assert _agrees(ws, "//...")  # unchanged: reused
    ws.write("p/a.txt", "edited\n")  # a source edit keeps the analysis
    assert _agrees(ws, "//...")
    assert ws.path("qbuild-out/p/@cat/all.txt").read_text() == "edited\nx\n"
    edits = [
        lambda: ws.write("p/b.txt", "b\n"),  # new glob match
        lambda: ws.write("p/d/k/x.txt", "x\n"),  # match in a new folder (multi-segment)
        lambda: os.unlink(ws.path("p/b.txt")),  # removed glob match
        lambda: ws.write("p/BUILD.toml", ws.path("p/BUILD.toml").read_text()
                         .replace("cat $(SRCS)", "cat $(SRCS) $(SRCS)")),  # BUILD edit
        lambda: ws.write("p/sub/qbuild.toml", ""),  # nested workspace appears
        lambda: os.unlink(ws.path("p/sub/qbuild.toml")),  # and goes
        lambda: ws.write("qbuild.toml", ws.path("qbuild.toml").read_text()
                         + 'output_dir = "qbuild-out"\n'),  # settings edit
    ]
    for edit in edits:
        ws.cli("build", "//...")  # cache what is there now
        edit()
        assert not _agrees(ws, "//..."), edit


def test_analysis_cache_rechecks_symlinks(ws, tmp_path):
    """A source or a folder swapped for a symlink out of the workspace is refused, as a
    fresh analysis refuses it, though the BUILD file and folder listings did not change."""
    ws.write("p/BUILD.toml", '[g]\nrule = "filegroup"\nsrcs = ["q/a.txt"]\n')
    ws.write("p/q/a.txt", "a\n")
    assert ws.cli("build", "//p:g").code == 0
    assert ws.cli("build", "//p:g").code == 0
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "a.txt").write_text("secret\n")
    os.rename(ws.path("p/q/a.txt"), tmp_path / "kept.txt")
    os.symlink(outside / "a.txt", ws.path("p/q/a.txt"))
    _agrees(ws, "//p:g")
    result = ws.cli("build", "//p:g")
    assert result.code == 2 and "outside the workspace" in result.stderr
    os.unlink(ws.path("p/q/a.txt"))
    os.rename(tmp_path / "kept.txt", ws.path("p/q/a.txt"))
    assert ws.cli("build", "//p:g").code == 0
    assert ws.cli("build", "//p:g").code == 0  # cached again
    os.rename(ws.path("p/q"), outside / "q")  # the folder itself becomes a link
    os.symlink(outside / "q", ws.path("p/q"))
    _agrees(ws, "//p:g")
    result = ws.cli("build", "//p:g")
    assert result.code == 2 and "outside the workspace" in result.stderr


def test_analysis_cache_follows_rule_code(ws, tmp_path, monkeypatch):
    """Editing the module of a rule (here a plugin loaded from a file) analyses again."""
    import importlib
    import sys

    from qbuild.analysis.plugins import load_registry
    from qbuild.analysis.workspace import load_workspace
    from qbuild.build.session import Session
    from qbuild.shortcuts import analysis_cache as _analysis_cache

    plugin = tmp_path / "plug" / "perf_probe_rules.py"
    plugin.parent.mkdir()
    source = '''
from qbuild import Rule, attr, hookimpl


class Probe(Rule):
    kind = "probe"
    attrs = {"n": attr.int(default=1)}

    def declared_outputs(self, name, attrs):
        return [f"out{attrs['n']}.txt"]

    def run(self, ctx):
        return {}


@hookimpl
def qbuild_rule_types():
    return [Probe]
'''
    plugin.write_text(source)
    monkeypatch.syspath_prepend(str(plugin.parent))
    module = importlib.import_module("perf_probe_rules")
    ws.register(module)
    ws.write("BUILD.toml", '[t]\nrule = "probe"\n')

    def graph():
        session = Session(load_workspace(ws.root), load_registry(ws.plugins))
        return session, session.graph

    session, g = graph()
    labels = g.expand(["//:t"], "")
    g.analyze(labels)
    time.sleep(0.06)
    _analysis_cache.save(g, ["//:t"], "", labels, time.time())
    session.close()
    session, g = graph()
    assert _analysis_cache.restore(g, ["//:t"], "") is not None
    assert g.targets[labels[0]].outputs == ["out1.txt"]
    session.close()
    plugin.write_text(source.replace("out{attrs", "o{attrs"))
    session, g = graph()
    assert _analysis_cache.restore(g, ["//:t"], "") is None
    assert not g.targets
    session.close()
    sys.modules.pop("perf_probe_rules", None)


def test_workspace_digest_memo_never_vouches_for_an_edit(ws):
    """The digests a workspace remembers (qbuild-out/.qbuild/digests.json) are keyed by
    the full stat: a same-size edit with the mtime put back is digested again."""
    ws.write("p/a.txt", "aaaa\n")
    ws.write("p/BUILD.toml", '[c]\nrule = "command"\nsrcs = ["a.txt"]\nouts = ["o.txt"]\n'
                             'cmd = "cat $(SRCS) > $(OUT)"\n')
    time.sleep(0.06)
    assert ws.cli("build", "//p:c").code == 0
    assert ws.path("qbuild-out/.qbuild/digests.json").is_file()
    path = ws.path("p/a.txt")
    st = os.stat(path)
    path.write_text("bbbb\n")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    result = ws.cli("build", "--explain", "//p:c")
    assert result.code == 0, result.stderr
    assert ws.path("qbuild-out/p/@c/o.txt").read_text() == "bbbb\n"
