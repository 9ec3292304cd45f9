"""Toy rules for issue 26's engine tests: an action that names a staged input as the
user knows it, blames the dependency it got, reports progress and warns about its log."""

from __future__ import annotations

from qbuild import AnalysisContext, Rule, RunContext, attr, hookimpl


def inspect(ctx: RunContext) -> None:
    """Fail naming each staged input by its workspace path, or blame the ``data``
    dependency, or report progress and warn, as the params say."""
    if ctx.params["blame"]:
        raise ctx.fail_at("data", "names no input of the model", attr="input")
    for done in range(1, 4):
        ctx.progress(done, 3)
    if ctx.params["name_inputs"]:
        names = [ctx.workspace_path(p) for p in ctx.inputs["srcs"]]
        raise ctx.fail(f"cannot read {', '.join(names)}", attr="srcs")
    ctx.log("details nobody needs on the console")
    ctx.warn(f"there are details: qbuild log {ctx.THIS_TARGET}")
    ctx.output("out.txt").write_text("ok\n")


class Inspect(Rule):
    kind = "inspect"
    doc = "Reads its inputs (issue 26 tests)."
    attrs = {
        "srcs": attr.files(doc="Files."),
        "data": attr.label(doc="A dependency."),
        "blame": attr.bool(default=False, doc="Fail at the data target."),
        "name_inputs": attr.bool(default=False, doc="Fail naming the inputs."),
    }
    outputs = ["out.txt"]

    def analyze(self, ctx: AnalysisContext) -> None:
        ctx.action(inspect, inputs=["srcs", "data"], outputs=["out.txt"],
                   params={k: ctx.attrs[k] for k in ("blame", "name_inputs")})


@hookimpl
def qbuild_rule_types() -> list[type[Rule]]:
    return [Inspect]
