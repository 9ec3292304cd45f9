"""Toy v2 rules for engine tests: a two-action rule giving typed providers, a consumer
asking for them, and a v1 rule that returns a provider from run()."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qbuild import (
    ActionContext,
    AnalysisContext,
    Provider,
    Rule,
    RunContext,
    attr,
    forward_files,
    hookimpl,
)


@dataclass(frozen=True)
class TextInfo(Provider):
    text: Path
    words: int
    lines: tuple[str, ...] = ()


@dataclass(frozen=True)
class ReportInfo(Provider):
    report: Path
    title: str


def transform(ctx: RunContext) -> TextInfo:
    text = "".join(p.read_text() for p in ctx.inputs["srcs"])
    if ctx.params["upper"]:
        text = text.upper()
    if ctx.params.get("fail"):
        raise ctx.fail("asked to fail", attr="fail")
    out = next(iter(ctx.outputs.values()))
    out.write_text(text)
    return TextInfo(out, len(text.split()), tuple(text.splitlines()))


def report(ctx: RunContext) -> ReportInfo:
    (name,) = ctx.inputs
    lines = ctx.inputs[name].read_text().splitlines()
    out = next(iter(ctx.outputs.values()))
    out.write_text(f"{ctx.params['title']}: {len(lines)} lines\n")
    return ReportInfo(out, ctx.params["title"])


class Summarize(Rule):
    kind = "summarize"
    doc = "Transform text, then report on it (two actions)."
    attrs = {
        "srcs": attr.files(doc="Text files.", required=True),
        "upper": attr.bool(default=False, doc="Upper-case (transform only)."),
        "title": attr.string(default="report", doc="Report title (report only)."),
        "fail": attr.bool(default=False, doc="Fail the transform."),
    }
    outputs = ["{name}.txt", "{name}.report"]
    provides = (TextInfo, ReportInfo)

    def analyze(self, ctx: AnalysisContext) -> None:
        ctx.action(transform, inputs=["srcs"], outputs=["{name}.txt"],
                   params={"upper": ctx.attrs["upper"], "fail": ctx.attrs["fail"]},
                   mnemonic="Transform")
        ctx.action(report, inputs=["{name}.txt"], outputs=["{name}.report"],
                   params={"title": ctx.attrs["title"]}, mnemonic="Report")


def consume(ctx: RunContext) -> None:
    deps = ctx.inputs["texts"]
    lines = []
    for dep in deps:
        info = dep[TextInfo]
        text = info.text.read_text().strip().replace("\n", "|")
        lines.append(f"{info.words} {text} {ReportInfo in dep} {dep.label!r}")
    ctx.output("all.txt").write_text("\n".join(lines) + "\n")


class Consume(Rule):
    kind = "consume"
    doc = "Read TextInfo of dependencies."
    attrs = {"texts": attr.label_list(doc="Text targets.", required=True,
                                      providers=[TextInfo])}
    outputs = ["all.txt"]

    def analyze(self, ctx: AnalysisContext) -> None:
        ctx.action(consume, inputs=["texts"], outputs=["all.txt"])


class LegacyText(Rule):
    """A v1 rule (run) that gives a provider and an info dict."""

    kind = "legacy_text"
    attrs = {"srcs": attr.files(doc="Text files.", required=True)}
    outputs = ["t.txt"]
    provides = (TextInfo,)

    def run(self, ctx: ActionContext):
        text = "".join(p.read_text() for p in ctx.attrs["srcs"])
        ctx.output("t.txt").write_text(text)
        return [TextInfo(ctx.output("t.txt"), len(text.split())), {"legacy": True}]




class Forgetful(Rule):
    """Declares a provider its run() does not return."""

    kind = "forgetful_v1"
    attrs = {}
    outputs = ["f.txt"]
    provides = (TextInfo,)

    def run(self, ctx: ActionContext):
        ctx.output("f.txt").write_text("x")
        return {"no": "provider"}


class ForgetfulV2(Rule):
    kind = "forgetful_v2"
    attrs = {}
    outputs = ["f.txt"]
    provides = (TextInfo,)

    def analyze(self, ctx: AnalysisContext) -> None:
        ctx.action(write_x, outputs=["f.txt"])


def write_x(ctx: RunContext) -> None:
    ctx.output("f.txt").write_text("x")


class ForwardDeps(Rule):
    """``forward_files`` over other targets' outputs: run in a sandbox (the engine's
    shortcut is for source files only)."""

    kind = "forward_deps"
    attrs = {"srcs": attr.files(doc="Files or targets.", required=True),
             "outs": attr.string_list(doc="One output name per input file.", required=True)}

    def declared_outputs(self, name: str, attrs: Any) -> list[str]:
        return list(attrs["outs"])

    def analyze(self, ctx: AnalysisContext) -> None:
        ctx.action(forward_files, inputs=["srcs"], outputs=ctx.outputs)


@hookimpl
def qbuild_rule_types():
    return [Summarize, Consume, LegacyText, Forgetful, ForgetfulV2, ForwardDeps]
