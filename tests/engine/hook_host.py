"""A test plugin that defines a hook of its own (``qbuild_greetings``) and a heavy rule
that calls it, as plugin-defined hooks are meant to be called: declared in ``code()``
and called through ``ctx.hooks``."""

from __future__ import annotations

from typing import Any

import pluggy

from qbuild import ActionContext, Rule, attr, hookimpl

hookspec = pluggy.HookspecMarker("qbuild")


class _Specs:
    @staticmethod
    @hookspec
    def qbuild_greetings() -> list[str]:  # type: ignore[empty-body]
        """Words to greet with."""


class Greet(Rule):
    """Writes every greeting the qbuild_greetings implementers give, in a worker."""

    kind = "greet"
    heavy = True
    attrs = {"who": attr.string(default="world", doc="Whom to greet.")}
    outputs = ["greeting.txt"]

    def code(self, attrs: Any) -> list[str]:
        return ["hook:qbuild_greetings"]

    def run(self, ctx: ActionContext) -> dict[str, Any]:
        words = sorted(w for found in ctx.hooks.qbuild_greetings() for w in found)
        ctx.output("greeting.txt").write_text(" ".join(words) + f" {ctx.attrs['who']}\n")
        return {"words": words}


@hookimpl
def qbuild_addhooks(pluginmanager: pluggy.PluginManager) -> None:
    pluginmanager.add_hookspecs(_Specs)


@hookimpl
def qbuild_rule_types() -> list[type[Rule]]:
    return [Greet]
