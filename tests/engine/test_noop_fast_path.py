"""The no-op fast path answers from stat calls alone, and never hides a change."""

import time


def _setup(ws):
    ws.write("p/a.txt", "a\n")
    ws.write("p/BUILD.toml", """
        [cat]
        rule = "command"
        srcs = ["*.txt"]
        outs = ["all.txt"]
        cmd = "cat $(SRCS) > $(OUT)"
    """)
    time.sleep(0.05)


def _build(ws, *args, **kw):
    result = ws.cli("build", *args, **kw)
    assert result.code == 0, result.stderr
    return result


def test_unchanged_workspace_takes_the_fast_path(ws):
    _setup(ws)
    first = _build(ws, "//...")
    assert "nothing changed" not in first.stderr
    second = _build(ws, "//...")
    assert "(nothing changed)" in second.stderr
    assert second.stdout == first.stdout


def test_every_kind_of_change_leaves_the_fast_path(ws):
    _setup(ws)
    _build(ws, "//...")
    ws.write("p/a.txt", "b\n")  # a source edit
    assert "1 actions run" in _build(ws, "//...").stderr
    ws.write("p/new.txt", "c\n")  # a new file matched by a glob
    assert "1 actions run" in _build(ws, "//...").stderr
    assert ws.path("qbuild-out/p/@cat/all.txt").read_text() == "b\nc\n"
    ws.write("q/BUILD.toml", '[x]\nrule = "command"\nouts = ["x"]\ncmd = "echo x > $(OUT)"\n')
    assert "1 actions run" in _build(ws, "//...").stderr  # a new package under //...
    ws.write("q/BUILD.toml", '[x]\nrule = "command"\nouts = ["x"]\ncmd = "echo y > $(OUT)"\n')
    assert "1 actions run" in _build(ws, "//...").stderr  # a BUILD file edit
    ws.path("qbuild-out/q/@x/x").unlink()  # a deleted output comes back
    assert "nothing changed" not in _build(ws, "//...").stderr
    assert ws.path("qbuild-out/q/@x/x").read_text() == "y\n"
    assert "(nothing changed)" in _build(ws, "//...").stderr


def test_a_different_python_environment_leaves_the_fast_path(ws, tmp_path):
    _setup(ws)
    _build(ws, "//...")
    other = _build(ws, "//...", env={"PYTHONPATH": str(tmp_path)})
    assert "nothing changed" not in other.stderr
