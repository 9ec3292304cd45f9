"""Key components read back from the store are data, not trusted code: ``qbuild explain``
and ``build --explain`` compare a target with its last build from the components the
local store kept, and damaged ones (not a table, wrong types, a damaged code record) are
one line saying the comparison is impossible, never an internal error."""

from __future__ import annotations

import pytest

from qbuild.keys.parts import DAMAGED, diff
from qbuild.store.local import LocalStore

BUILD = '[t]\nrule = "command"\nouts = ["o.txt"]\ncmd = "echo {word} > $(OUT)"\n'

DAMAGE = {
    "attrs a list": lambda parts: {**parts, "attrs": [1, 2]},
    "code not strings": lambda parts: {**parts, "code": {"unit": 5}},
    "dependency without outputs": lambda parts: {**parts, "deps": {"//p:x": {"info": {}}}},
    "env a string": lambda parts: {**parts, "env": "PATH=/bin"},
    "sources a list": lambda parts: {**parts, "sources": ["a"]},
}


def _damage_last_components(ws, how):
    """Build //p:t, then rewrite the key components its last build stored (through the
    local store's own API, as a damaged or tampered cache would hold them)."""
    ws.write("p/BUILD.toml", BUILD.format(word="one"))
    built = ws.cli("build", "//p:t")
    assert built.code == 0, built.stderr
    key = ws.aquery("//p:t")[0]["key"]
    store = LocalStore(ws.cache_dir)
    try:
        parts = store.get_components(key)
        assert parts is not None
        store.put_components(key, DAMAGE[how](parts))
    finally:
        store.close()
    ws.write("p/BUILD.toml", BUILD.format(word="two"))


@pytest.mark.parametrize("how", sorted(DAMAGE))
def test_explain_says_damaged_components_cannot_be_compared(ws, how):
    _damage_last_components(ws, how)
    out = ws.cli("explain", "//p:t")
    assert out.code == 0, out.stderr
    assert "Traceback" not in out.stderr + out.stdout
    assert "internal error" not in out.stderr + out.stdout
    assert f"  {DAMAGED} (" in out.stdout + out.stderr


def test_build_explain_says_damaged_components_cannot_be_compared_and_builds(ws):
    _damage_last_components(ws, "attrs a list")
    out = ws.cli("build", "--explain", "//p:t")
    assert out.code == 0, out.stderr
    assert f"//p:t will run: {DAMAGED} (key part 'attrs' is not a table)" in out.stderr
    assert "Traceback" not in out.stderr
    assert (ws.root / "qbuild-out/p/@t/o.txt").read_text() == "two\n"


def test_undamaged_components_are_still_compared(ws):
    ws.write("p/BUILD.toml", BUILD.format(word="one"))
    assert ws.cli("build", "//p:t").code == 0
    ws.write("p/BUILD.toml", BUILD.format(word="two"))
    out = ws.cli("explain", "//p:t")
    assert out.code == 0, out.stderr
    assert "attribute 'cmd'" in out.stdout + out.stderr
    assert DAMAGED not in out.stdout + out.stderr


@pytest.mark.parametrize("old", [[], "text", {"code": {"u": 1}}, {"deps": {"//x:y": 3}},
                                 {"attrs": {"a": 1}, "deps": {"//x:y": {"outputs": [],
                                                                         "info": {}}}}])
def test_diff_of_damaged_components_is_one_line(old):
    new = {"label": "//p:t", "qbuild_version": "1", "code": {}, "rule": "r",
           "rule_version": 1, "plugin": "p", "plugin_version": "1", "attrs": {"a": 2},
           "outputs": [], "sources": {}, "executable_sources": [], "deps": {}, "env": {}}
    lines = diff(old, new)
    assert len(lines) == 1 and lines[0].startswith(f"{DAMAGED} ("), lines


def test_a_damaged_code_record_names_the_unit_instead_of_its_files():
    old = {"code": {"unit": "a" * 64}}
    new = {"label": "//p:t", "qbuild_version": "1", "code": {"unit": "b" * 64}, "rule": "r",
           "rule_version": 1, "plugin": "p", "plugin_version": "1", "attrs": {},
           "outputs": [], "sources": {}, "executable_sources": [], "deps": {}, "env": {}}
    records = {"a" * 64: ["not", "a", "table"], "b" * 64: {"f.py": "c" * 64}}
    lines = diff({**old, "label": "//p:t"}, new, records.get)  # type: ignore[arg-type]
    assert "rule code changed: unit" in lines
