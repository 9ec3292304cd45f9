"""The ``command`` rule keys every program it may run (issue 24, defect 6): a tool named
inside backticks, ``"$(...)"`` or a quoted ``sh -c '...'``, or declared in ``tools``
(for one a script starts without ``cmd`` naming it), is keyed by its content, so
upgrading it on PATH builds again instead of serving the old output."""

from __future__ import annotations

import os

import pytest

COMMANDS = {
    "backticks": ('echo `mytool` > $(OUT)', ""),
    "quoted substitution": ('echo "$(mytool)" > $(OUT)', ""),
    "sh -c": ("sh -c 'mytool | cat' > $(OUT)", ""),
    "declared": ("sh $(SRCS) > $(OUT)", 'srcs = ["run.sh"]\ntools = ["mytool"]\n'),
}


def _tool(folder, version: str) -> None:
    path = folder / "mytool"
    path.write_text(f"#!/bin/sh\necho {version}\n")
    path.chmod(0o755)


@pytest.mark.parametrize("case", sorted(COMMANDS))
def test_upgrading_a_tool_the_command_runs_builds_again(qbuild_workspace, tmp_path, case):
    ws = qbuild_workspace
    cmd, extra = COMMANDS[case]
    tools = tmp_path / "tools"
    tools.mkdir()
    _tool(tools, "one")
    ws.write("p/run.sh", "mytool\n")
    ws.write("p/BUILD.toml", f"[t]\nrule = 'command'\ncmd = '''{cmd}'''\n"
                             f"outs = ['out.txt']\n{extra}")
    env = {"PATH": f"{tools}{os.pathsep}{os.environ['PATH']}"}
    first = ws.cli("build", "//p:t", env=env)
    assert first.code == 0, first.stderr
    out = ws.root / "qbuild-out" / "p" / "@t" / "out.txt"
    assert out.read_text() == "one\n"
    _tool(tools, "two")  # an upgrade in place, as a package manager does
    second = ws.cli("build", "//p:t", env=env)
    assert second.code == 0, second.stderr
    assert out.read_text() == "two\n"
