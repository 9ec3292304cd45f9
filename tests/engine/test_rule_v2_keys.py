"""Keys of v2 actions cover their own code: each action's function package and the
provider classes involved. Editing one action's module reruns that action only."""

import importlib
import sys
import textwrap

import pytest

PROVIDER = '''
from dataclasses import dataclass
from pathlib import Path

from qbuild import Provider


@dataclass(frozen=True)
class CountInfo(Provider):
    counted: Path
    n: int
'''

FIRST = '''
from rv2k_prov import CountInfo


def first(ctx):
    text = "".join(p.read_text() for p in ctx.inputs["srcs"])
    out = ctx.output("n.txt")
    out.write_text(str(len(text.split())) + "\\n")
    return CountInfo(out, len(text.split()))
'''

SECOND = '''
def second(ctx):
    n = int(ctx.inputs["n.txt"].read_text())
    ctx.output("report.txt").write_text(f"{ctx.params['title']}: {n}\\n")
'''

RULES = '''
from qbuild import Rule, attr, hookimpl
from rv2k_a import first
from rv2k_b import second
from rv2k_prov import CountInfo


class TwoModules(Rule):
    kind = "two_modules"
    attrs = {"srcs": attr.files(required=True), "title": attr.string(default="n")}
    outputs = ["n.txt", "report.txt"]
    provides = (CountInfo,)

    def analyze(self, ctx):
        ctx.action(first, inputs=["srcs"], outputs=["n.txt"], mnemonic="First")
        ctx.action(second, inputs=["n.txt"], outputs=["report.txt"],
                   params={"title": ctx.attrs["title"]}, mnemonic="Second")


@hookimpl
def qbuild_rule_types():
    return [TwoModules]
'''

MODULES = {"rv2k_prov": PROVIDER, "rv2k_a": FIRST, "rv2k_b": SECOND, "rv2k_rules": RULES}


@pytest.fixture
def plugin(tmp_path):
    folder = tmp_path / "plugin"
    folder.mkdir()
    for name, text in MODULES.items():
        (folder / f"{name}.py").write_text(textwrap.dedent(text))
    sys.path.insert(0, str(folder))
    try:
        yield folder, importlib.import_module("rv2k_rules")
    finally:
        sys.path.remove(str(folder))
        for name in MODULES:
            sys.modules.pop(name, None)


def test_each_action_is_keyed_by_its_own_code(ws, plugin):
    folder, rules = plugin
    ws.register(rules)
    ws.write("p/a.txt", "one two three\n")
    ws.write("p/BUILD.toml", '[t]\nrule = "two_modules"\nsrcs = ["a.txt"]\n')
    first = ws.build("//p:t")
    assert first.ok, first.error
    assert first.actions["//p:t"] == {"First": "ran", "Second": "ran"}

    def edit(name):
        with open(folder / f"{name}.py", "a") as handle:
            handle.write("# edited\n")

    edit("rv2k_b")  # the second action's module: only it runs again
    assert ws.build("//p:t").actions["//p:t"] == {"First": "cached", "Second": "ran"}
    edit("rv2k_a")  # the first action's module: it runs; same bytes, so the second hits
    assert ws.build("//p:t").actions["//p:t"] == {"First": "ran", "Second": "cached"}
    edit("rv2k_prov")  # the provider's code is in every action of a rule giving it
    assert ws.build("//p:t").actions["//p:t"] == {"First": "ran", "Second": "ran"}
    edit("rv2k_rules")  # the rule class alone (analysis): params decide, nothing reruns
    again = ws.build("//p:t")
    assert again.ok and again.actions["//p:t"] == {"First": "cached", "Second": "cached"}
