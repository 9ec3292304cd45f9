"""Nothing is printed after a build's summary (issue 24, defect 19): through the paths
the shortcut, key and command changes of this issue touch (a full build, the fast path
repeating toolchain warnings, a failing command, a declared tool that is missing, an
edit taken by the incremental path), the summary ("Build OK" or "Build FAILED" with its
indented details) ends stderr. Uses only the CLI: runs on 05cd88b too."""

from __future__ import annotations

import pytest


def summary_is_last(stderr: str) -> bool:
    """Is the last "Build ..." line followed only by its indented details?"""
    lines = stderr.rstrip("\n").splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(("Build OK", "Build FAILED"))]
    if not starts:
        return False
    return all(line.startswith("  ") for line in lines[starts[-1] + 1:])


@pytest.fixture
def workspace(qbuild_workspace):
    ws = qbuild_workspace
    ws.write("qbuild.toml", "[settings]\ncache_dir = '../cache'\n[toolchain]\npluggy = '0.0.1'\n")
    ws.write("p/a.txt", "a\n")
    ws.write("p/BUILD.toml", """
        [copy]
        rule = "command"
        srcs = ["a.txt"]
        outs = ["b.txt"]
        cmd = "cat $(SRCS) > $(OUT)"
        tools = ["cat"]

        [fails]
        rule = "command"
        outs = ["c.txt"]
        cmd = "exit 3"

        [missing_tool]
        rule = "command"
        outs = ["d.txt"]
        cmd = "echo d > $(OUT)"
        tools = ["no-such-tool-qb"]
    """)
    return ws


def test_the_summary_ends_every_build(workspace):
    ws = workspace
    warn = "--toolchain_mismatch=warn"
    runs = [ws.cli("build", "//p:copy", warn), ws.cli("build", "//p:copy", warn)]
    assert "(nothing changed)" in runs[-1].stderr and "toolchain mismatch" in runs[-1].stderr
    ws.write("p/a.txt", "edited\n")
    runs.append(ws.cli("build", "//p:copy", warn))
    runs.append(ws.cli("build", "//p:missing_tool", warn))
    failed = ws.cli("build", "//p:fails", "//p:copy", warn, "--keep_going")
    assert failed.code == 1
    runs.append(failed)
    for run in runs:
        assert summary_is_last(run.stderr), run.stderr
        assert "internal error" not in run.stderr and "Traceback" not in run.stderr
