"""Issue 26, everyday use in the engine: messages name inputs as the user knows them
(point 7), an error a dependency causes is reported at it, progress inside actions on
the live line, one line per failure, list advice that is right (point 9), warnings that
point at ``qbuild log`` (point 5)."""

from __future__ import annotations

import io

import pytest
import toy_everyday

from qbuild.build.progress import ConsoleReporter
from qbuild.core import live

BUILD = """
[files]
rule = "filegroup"
srcs = ["calib/notes.txt"]

[data]
rule = "command"
outs = ["d.txt"]
cmd = "echo d > $(OUT)"

[t]
rule = "inspect"
srcs = [":files", "own.txt"]
data = ":data"
{extra}
"""


@pytest.fixture
def ws(qbuild_workspace):
    qbuild_workspace.register(toy_everyday)
    qbuild_workspace.write("images/calib/notes.txt", "n\n")
    qbuild_workspace.write("images/own.txt", "o\n")
    return qbuild_workspace


def test_a_message_names_staged_inputs_by_their_workspace_paths(ws):
    ws.write("images/BUILD.toml", BUILD.format(extra="name_inputs = true"))
    result = ws.build("//images:t")
    assert not result.ok
    # a filegroup's file is named by its source's workspace path
    assert ("cannot read images/calib/notes.txt, images/own.txt"
            in result.error), result.error
    assert ".dep0" not in result.error and ".src" not in result.error


def test_an_error_a_dependency_causes_is_reported_at_that_dependency(ws):
    ws.write("images/BUILD.toml", BUILD.format(extra="blame = true"))
    result = ws.build("//images:t")
    assert not result.ok
    assert ("images/BUILD.toml, target //images:data, attribute 'input': names no input "
            "of the model") in result.error


def test_a_warning_names_the_target_whose_log_to_read(ws):
    ws.write("images/BUILD.toml", BUILD.format(extra=""))
    result = ws.build("//images:t")
    assert result.ok, result.error
    assert "there are details: qbuild log //images:t" in result.log
    assert "<this target>" not in result.log


def test_progress_reported_by_a_running_action_is_on_the_live_line(tmp_path):
    (tmp_path / live.PROGRESS_NAME).write_text("120 500\n")
    stream = io.StringIO()
    reporter = ConsoleReporter(stream, tty=True)
    reporter.total = 1
    live.watch("//m:calib", tmp_path / live.PROGRESS_NAME)
    try:
        reporter.action_started("//m:calib")
    finally:
        live.forget("//m:calib")
    assert "slowest: //m:calib 0.0s, 120/500" in stream.getvalue()


def test_an_action_reports_its_progress_through_the_engine(ws, monkeypatch):
    seen: list[tuple[int, int] | None] = []
    forget = live.forget

    def spy(label: str) -> None:  # what the console would read as the action ends
        seen.append(live.read(label))
        forget(label)

    monkeypatch.setattr(live, "forget", spy)
    ws.write("images/BUILD.toml", BUILD.format(extra=""))
    assert ws.build("//images:t").ok
    assert (3, 3) in seen


def test_a_failure_is_printed_once_with_its_reason(ws):
    ws.write("p/BUILD.toml", '[bad]\nrule = "command"\nouts = ["o"]\ncmd = "exit 3"\n')
    out = ws.cli("build", "//p:bad")
    assert out.code == 1
    assert out.stderr.count("command exited with status 3") == 1, out.stderr
    assert "FAILED: //p:bad (why: in the summary)" in out.stderr
    quiet = ws.cli("build", "-q", "//p:bad")
    assert quiet.stderr.count("command exited with status 3") == 1
    assert "FAILED: //p:bad: " in quiet.stderr


@pytest.mark.parametrize(("value", "advice"), [
    ('"224x224"', "expected a list of integers, got a string (write [224, 224])"),
    ("224", "expected a list of integers, got an integer (write [224])"),
    ('"224"', "(write [224])"),
])
def test_a_lone_value_where_numbers_are_listed_gets_advice_that_works(ws, value, advice):
    ws.write("images/BUILD.toml", '[c]\nrule = "command"\nouts = ["o"]\ncmd = "x"\n'
             'matrix = {}\n'.replace("matrix = {}\n", "") + f'[i]\nrule = "ints"\nn = {value}\n')
    ws.register(_ints())
    result = ws.build("//images:i")
    assert result.exit_code == 2
    assert advice in result.error


def _ints():
    import types

    from qbuild import Rule, attr, hookimpl

    class Ints(Rule):
        kind = "ints"
        attrs = {"n": attr.int_list(doc="Numbers.")}
        outputs: list[str] = []

    module = types.ModuleType("ints_rules")

    @hookimpl
    def qbuild_rule_types() -> list[type[Rule]]:
        return [Ints]

    module.qbuild_rule_types = qbuild_rule_types  # type: ignore[attr-defined]
    return module
