"""A toy v2 rule whose list of dependencies tolerates failures: it writes one line per
dependency (its words, or why it failed) and fails only when every one failed."""

from __future__ import annotations

from toy_rules_v2 import TextInfo

from qbuild import AnalysisContext, Rule, RunContext, attr, hookimpl


def best_of(ctx: RunContext) -> None:
    lines = []
    for dep in ctx.inputs["texts"]:
        lines.append(f"failed: {dep.failed}" if dep.failed is not None
                     else f"ok {dep[TextInfo].words}")
    if all(line.startswith("failed") for line in lines):
        raise ctx.fail("every candidate failed", attr="texts")
    ctx.output("best.txt").write_text("\n".join(lines) + "\n")


class BestOf(Rule):
    kind = "best_of"
    doc = "One line per candidate; a failed candidate is listed, not fatal."
    attrs = {"texts": attr.label_list(doc="Candidates.", required=True, providers=[TextInfo],
                                      tolerate_failures=True),
             "base": attr.label(doc="A dependency that must build.", providers=[TextInfo])}
    outputs = ["best.txt"]

    def analyze(self, ctx: AnalysisContext) -> None:
        ctx.action(best_of, inputs=["texts", "base"], outputs=["best.txt"])


@hookimpl
def qbuild_rule_types():
    return [BestOf]
