"""The shortcuts answer from the same facts as keys (issue 24: defects 5 and 17, and the
suspected "environment variables read by other rules"): a fact the full path puts into
a key (the machine class, a variable a rule's ``env()`` reads, a toolchain mismatch
that stops the full path) makes the no-op fast path and the incremental path step aside
when it changes."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from qbuild import ActionContext, Rule, attr, hookimpl
from qbuild.keys import machine as _machine
from qbuild.keys import parts as _keys
from qbuild.shortcuts.noop import try_noop


class MachineProbe(Rule):
    """Writes its text; declared machine-dependent."""

    kind = "facts_machine_probe"
    machine_dependent = True
    attrs = {"text": attr.string(default="m", doc="Text.")}
    outputs = ["out.txt"]

    def run(self, ctx: ActionContext) -> dict[str, Any]:
        ctx.output("out.txt").write_text(ctx.attrs["text"])
        return {}


class EnvProbe(MachineProbe):
    """Keyed by a variable its ``env()`` reads (as a plugin's own setting would be)."""

    kind = "facts_env_probe"
    machine_dependent = False

    def env(self) -> dict[str, str]:
        return {"flavor": os.environ.get("QB_TEST_FLAVOR", "plain")}


class _Plugin:
    @hookimpl
    def qbuild_rule_types(self) -> list[type]:
        return [MachineProbe, EnvProbe]


@pytest.fixture
def new_process(monkeypatch):
    """Set variables as a new ``qbuild`` process would see them (the per-process memos
    of rule and machine facts forgotten)."""
    def setenv(name: str, value: str) -> None:
        monkeypatch.setenv(name, value)
        _machine.machine_facts.cache_clear()
        _keys._env_cache.clear()

    yield setenv
    _machine.machine_facts.cache_clear()
    _keys._env_cache.clear()


def _fast_path_answers(ws) -> bool:
    """Would the command line's no-op fast path answer the last request now?"""
    snapshots = list((ws.root / "qbuild-out" / ".qbuild" / "noop").glob("*.json"))
    assert len(snapshots) == 1
    options = json.loads(snapshots[0].read_text())["environment"]["options"]
    for package in (None, ""):
        found = try_noop(Path(ws.root), ws.root / "qbuild-out", ["//:t"], package, options)
        if found is not None:
            return True
    return False


@pytest.mark.parametrize("kind,variable", [("facts_machine_probe", "QBUILD_MACHINE_CLASS"),
                                           ("facts_env_probe", "QB_TEST_FLAVOR")])
def test_a_changed_key_fact_leaves_both_shortcuts(ws, reused, new_process, kind, variable):
    ws.register(_Plugin())
    ws.write("BUILD.toml", f"[t]\nrule = '{kind}'\n")
    new_process(variable, "avx2-box")
    assert ws.build("//:t").ran == ["//:t"]
    assert ws.build("//:t").cached == ["//:t"]
    assert _fast_path_answers(ws)  # nothing changed: the shortcut may answer
    new_process(variable, "amx-box")
    assert not _fast_path_answers(ws)
    reused.clear()
    again = ws.build("//:t")
    assert again.ran == ["//:t"] and reused == []  # the full path's answer: a new key
    new_process(variable, "avx2-box")
    assert ws.build("//:t").cached == ["//:t"]


def test_a_plain_build_after_a_warned_toolchain_mismatch_still_stops(qbuild_workspace):
    """Defect 17: after ``--toolchain_mismatch=warn`` the fast path must not answer a
    plain build (the full path exits 2), and answers a warned one with its warning."""
    ws = qbuild_workspace
    ws.write("qbuild.toml", "[settings]\ncache_dir = '../cache'\n"
                            "[toolchain]\npluggy = '0.0.1'\n")
    ws.write("BUILD.toml", "[files]\nrule = 'filegroup'\nsrcs = ['a.txt']\n")
    ws.write("a.txt", "hello\n")
    assert ws.cli("build", "//:files", "--toolchain_mismatch=warn").code == 0
    warned = ws.cli("build", "//:files", "--toolchain_mismatch=warn")
    assert warned.code == 0 and "warning: toolchain mismatch: pluggy" in warned.stderr
    plain = ws.cli("build", "//:files")
    assert plain.code == 2, plain.stderr
    assert "toolchain mismatch" in plain.stderr and "Build OK" not in plain.stderr


def test_only_the_rule_s_own_reads_are_key_facts(monkeypatch):
    """Variables a rule's facts read are noted with their values; another thread
    listing the environment meanwhile (an action running) is not a key fact."""
    import threading

    from qbuild.keys import environ

    monkeypatch.setattr(environ, "_read", {})
    monkeypatch.setenv("QB_TEST_NOTED", "yes")
    listed = threading.Event()
    done = threading.Event()

    def other_thread() -> None:
        listed.wait()
        dict(os.environ)  # lists every variable, from another thread
        done.set()

    thread = threading.Thread(target=other_thread)
    thread.start()

    def facts() -> dict[str, str]:
        listed.set()
        done.wait()
        return {"noted": os.environ.get("QB_TEST_NOTED", ""),
                "absent": os.getenv("QB_TEST_ABSENT", "")}

    assert environ.watched(facts) == {"noted": "yes", "absent": ""}
    thread.join()
    assert environ.reads() == {"QB_TEST_NOTED": "yes", "QB_TEST_ABSENT": None}
    assert environ.unchanged(environ.reads())
    monkeypatch.setenv("QB_TEST_ABSENT", "now set")
    assert not environ.unchanged({"QB_TEST_NOTED": "yes", "QB_TEST_ABSENT": None})
    assert type(os.environ).__name__ == "_Environ"  # put back


def test_a_variable_of_a_target_reused_unasked_is_still_checked(ws, reused, new_process):
    """The incremental path reuses a target without asking its rule again: the
    variables its facts read are carried into the next record all the same."""
    ws.register(_Plugin())
    ws.write("a.txt", "one\n")
    ws.write("BUILD.toml", "[t]\nrule = 'facts_env_probe'\n"
                           "[c]\nrule = 'concat'\nsrcs = ['a.txt']\n")
    # (No event says a file left the racy window: a build records only what is older
    # than the filesystem's timestamp granularity, 50 ms here, as test_incremental_path.)
    time.sleep(0.06)
    new_process("QB_TEST_FLAVOR", "first")
    assert sorted(ws.build("//:t", "//:c").ran) == ["//:c", "//:t"]
    ws.write("a.txt", "two\n")
    time.sleep(0.06)
    new_process("QB_TEST_FLAVOR", "first")
    reused.clear()
    assert ws.build("//:t", "//:c").ran == ["//:c"] and "//:t" in reused
    new_process("QB_TEST_FLAVOR", "second")
    reused.clear()
    assert ws.build("//:t", "//:c").ran == ["//:t"] and "//:t" not in reused
