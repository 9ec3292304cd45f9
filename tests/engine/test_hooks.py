"""Hooks as pytest has them: typed events carrying the action key, plugin-defined hooks
resolved once in the main process (so a plugin registered in-process reaches a worker
process, and its identity is in the key), ``-p no:NAME`` and ``qbuild info --plugins``."""

from __future__ import annotations

import hook_hello
import hook_host

from qbuild import hookimpl
from qbuild.build.state import WorkspaceState
from qbuild.events import ActionEvent, BuildSummary

BUILD = """
[hi]
rule = "greet"
"""


class Recorder:
    def __init__(self) -> None:
        self.events: list[ActionEvent] = []
        self.summaries: list[BuildSummary] = []

    @hookimpl
    def qbuild_action_finished(self, event: ActionEvent) -> None:
        self.events.append(event)

    @hookimpl
    def qbuild_build_finished(self, summary: BuildSummary) -> None:
        self.summaries.append(summary)


def test_a_registered_plugin_reaches_the_worker_and_the_key(ws):
    ws.register(hook_host)
    ws.write("g/BUILD.toml", BUILD)
    alone = ws.build("//g:hi")
    assert alone.ok, alone.error
    assert ws.path("qbuild-out/g/@hi/greeting.txt").read_text() == " world\n"
    ws.register(hook_hello)  # a new implementer: a new key, and the worker calls it
    greeted = ws.build("//g:hi")
    assert greeted.ran == ["//g:hi"]
    assert ws.path("qbuild-out/g/@hi/greeting.txt").read_text() == "hello world\n"
    assert greeted.info("//g:hi") == {"words": ["hello"]}
    assert ws.build("//g:hi").cached == ["//g:hi"]


def test_blocking_a_plugin_leaves_it_out_of_hooks_and_keys(ws):
    ws.register(hook_host)
    ws.register(hook_hello)
    ws.write("g/BUILD.toml", BUILD)
    assert ws.build("//g:hi").ok
    blocked = ws.build("//g:hi", blocked=("hook_hello",))
    assert blocked.ran == ["//g:hi"]
    assert ws.path("qbuild-out/g/@hi/greeting.txt").read_text() == " world\n"


def test_events_are_typed_carry_the_key_and_still_read_like_dicts(ws):
    recorder = Recorder()
    ws.register(recorder)
    ws.write("p/BUILD.toml", """
        [a]
        rule = "concat"
        srcs = ["a.txt"]
        [bad]
        rule = "fail"
    """)
    ws.write("p/a.txt", "a")
    ws.build("//p:a", "//p:bad", keep_going=True)
    by_label = {e.label: e for e in recorder.events}
    ran = by_label["//p:a"]
    assert isinstance(ran, ActionEvent) and ran.status == "ran"
    assert ran.key == WorkspaceState(ws.path("qbuild-out")).last_keys["//p:a"]
    assert ran["label"] == "//p:a" and ran.get("key") == ran.key and "seconds" in ran
    assert by_label["//p:bad"].status == "failed" and by_label["//p:bad"].error
    (summary,) = recorder.summaries
    assert isinstance(summary, BuildSummary) and not summary.ok
    assert summary.failed == 1 and summary["actions_run"] == summary.actions_run
    ws.build("//p:a")
    cached = recorder.events[-1]
    assert cached.status == "cached" and cached.key == ran.key


def test_info_plugins_and_p_no(qbuild_workspace):
    ws = qbuild_workspace
    shown = ws.cli("info", "--plugins")
    assert shown.code == 0, shown.stderr
    line = next(x for x in shown.stdout.splitlines() if x.startswith("generic:"))
    assert " qbuild 0.2.0 from " in line and line.endswith("__init__.py")
    assert "  rules: " in shown.stdout
    blocked = ws.cli("-p", "no:generic", "info", "--plugins")
    assert "generic: qbuild 0.2.0 (qbuild_generic) blocked (-p no:generic)" in blocked.stdout
    rules = ws.cli("rules", "-p", "no:generic")
    assert rules.code == 0 and "filegroup" not in rules.stdout
    ws.write("qbuild.toml", ws.path("qbuild.toml").read_text()
             + 'plugins = ["no:generic"]\n')
    ws.write("p/BUILD.toml", '[g]\nrule = "filegroup"\nsrcs = ["f.txt"]\n')
    ws.write("p/f.txt", "x")
    build = ws.cli("build", "//p:g")
    assert build.code == 2 and "unknown rule 'filegroup'" in build.stderr
    bad = ws.cli("build", "-p", "generic", "//p:g")
    assert bad.code == 2 and "only 'no:NAME'" in bad.stderr
