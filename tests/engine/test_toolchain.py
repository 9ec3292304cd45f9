"""Toolchain pins in qbuild.toml, `qbuild info`, machine facts in keys of machine-dependent
rules, and rules whose required distributions are missing."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from qbuild import ActionContext, Rule, attr, dist_version, hookimpl
from qbuild.keys import machine as _machine
from qbuild.keys import parts as _keys
from qbuild.keys.toolchain import matches, mismatches

PLUGGY = dist_version("pluggy")


def _workspace(ws, toolchain: str = "") -> None:
    ws.write("qbuild.toml", f"[settings]\ncache_dir = '../cache'\n{toolchain}")
    ws.write("BUILD.toml", "[files]\nrule = 'filegroup'\nsrcs = ['a.txt']\n")
    ws.write("a.txt", "hello\n")


def test_version_patterns():
    assert matches("1.31.1", "1.31.1") and matches("1.31.1", "==1.31.1")
    assert matches("1.31.1", "1.31.*") and not matches("1.310.0", "1.31.*")
    assert not matches("1.32.0", "1.31.1")
    assert mismatches({"pluggy": PLUGGY}) == []
    assert mismatches({"no-such-distribution-qb": "1"}) == [
        "no-such-distribution-qb 1 is pinned but not installed"]


def test_a_mismatched_pin_stops_the_build_with_one_line(qbuild_workspace):
    ws = qbuild_workspace
    _workspace(ws, "[toolchain]\npluggy = '0.0.1'\ndiskcache = '0.0.2'\n")
    out = ws.cli("build", "//:files")
    assert out.code == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr
    assert f"pluggy {PLUGGY} is installed, 0.0.1 is pinned" in lines[0]
    assert "diskcache" in lines[0] and "qbuild.toml" in lines[0]
    assert not (ws.root / "qbuild-out" / "files").exists()
    warned = ws.cli("build", "//:files", "--toolchain_mismatch=warn")
    assert warned.code == 0, warned.stderr
    assert "warning: toolchain mismatch: pluggy" in warned.stderr


def test_a_matching_pin_builds_and_info_shows_it(qbuild_workspace):
    ws = qbuild_workspace
    _workspace(ws, f"[toolchain]\npluggy = '{PLUGGY}'\n")
    assert ws.cli("build", "//:files").code == 0
    info = ws.cli("info")
    assert info.code == 0, info.stderr
    text = info.stdout
    assert f"pluggy {PLUGGY}  (pinned {PLUGGY}: ok)" in text
    assert f"python {sys.version_info[0]}.{sys.version_info[1]}" in text
    assert str((ws.root / ".." / "cache").resolve()) in text and " KB in " in text
    assert "onnxruntime " + dist_version("onnxruntime") in text
    assert "qbuild_onnx/rules: " in text and "quantize" in text  # plugins and their rules
    assert "machine class" in text


def test_bad_toolchain_table_is_a_config_error(qbuild_workspace):
    ws = qbuild_workspace
    _workspace(ws, "[toolchain]\nonnxruntime = 1.31\n")
    out = ws.cli("build", "//:files")
    assert out.code == 2 and "[toolchain] must map distribution names" in out.stderr


class Probe(Rule):
    """Writes a constant; declared machine-dependent."""

    kind = "machine_probe"
    machine_dependent = True
    attrs = {"text": attr.string(default="x", doc="Text.")}
    outputs = ["out.txt"]

    def run(self, ctx: ActionContext) -> dict[str, Any]:
        ctx.output("out.txt").write_text(ctx.attrs["text"])
        return {}


class Pure(Probe):
    kind = "pure_probe"
    machine_dependent = False


class NeedsMissing(Probe):
    kind = "needs_missing"
    machine_dependent = False
    requires = ("no-such-distribution-qb",)
    install_hint = "pip install 'qbuild[nothing]'"


class _Plugin:
    @hookimpl
    def qbuild_rule_types(self):
        return [Probe, Pure, NeedsMissing]


@pytest.fixture
def machine_class(monkeypatch):
    def set_class(name: str) -> None:
        monkeypatch.setenv("QBUILD_MACHINE_CLASS", name)
        _machine.machine_facts.cache_clear()
        _keys._env_cache.clear()

    yield set_class
    _machine.machine_facts.cache_clear()
    _keys._env_cache.clear()


def test_machine_dependent_results_are_not_served_to_another_machine_class(
        qbuild_workspace, machine_class):
    ws = qbuild_workspace
    ws.register(_Plugin())
    ws.write("BUILD.toml", "[m]\nrule = 'machine_probe'\n[p]\nrule = 'pure_probe'\n")
    machine_class("avx2-box")
    first = ws.build("//:m", "//:p")
    assert first.ok and set(first.ran) == {"//:m", "//:p"}
    assert set(ws.build("//:m", "//:p").cached) == {"//:m", "//:p"}
    machine_class("amx-box")
    second = ws.build("//:m", "//:p", explain=True)
    assert second.ran == ["//:m"] and second.cached == ["//:p"]
    assert "environment 'machine.class': avx2-box -> amx-box" in str(second.explanations)
    machine_class("avx2-box")
    assert set(ws.build("//:m", "//:p").cached) == {"//:m", "//:p"}


def test_machine_facts_are_read_from_the_cpu(monkeypatch):
    monkeypatch.delenv("QBUILD_MACHINE_CLASS", raising=False)
    _machine.machine_facts.cache_clear()
    try:
        facts = _machine.machine_facts()
        assert set(facts) == {"machine.arch", "machine.isa"} and facts["machine.arch"]
    finally:
        _machine.machine_facts.cache_clear()


def test_a_rule_with_a_missing_distribution_fails_at_analysis(qbuild_workspace):
    ws = qbuild_workspace
    ws.register(_Plugin())
    ws.write("BUILD.toml", "[n]\nrule = 'needs_missing'\n")
    result = ws.build("//:n")
    assert not result.ok and result.ran == []
    assert "rule 'needs_missing' needs no-such-distribution-qb, which is not installed: " \
           "pip install 'qbuild[nothing]'" in str(result.error)
    assert "BUILD.toml" in str(result.error)


def test_builtin_rules_declare_what_they_are(qbuild_workspace):
    ws = qbuild_workspace
    _workspace(ws)
    calibrate = ws.cli("rules", "calibrate").stdout
    quantize = ws.cli("rules", "quantize").stdout
    assert "machine-dependent: yes" in calibrate
    assert "machine-dependent: no" in quantize
    assert "requires: onnx, onnxruntime, numpy" in quantize


def test_test_workspaces_keep_their_own_cache_under_a_shared_qbuild_cache_dir(
        qbuild_workspace, tmp_path, monkeypatch):
    shared = tmp_path / "shared-cache"
    monkeypatch.setenv("QBUILD_CACHE_DIR", str(shared))
    ws = qbuild_workspace
    _workspace(ws)
    assert ws.build("//:files").ok
    assert not shared.exists()
    assert (ws.root / ".." / "cache").resolve().is_dir()
