"""Example qbuild plugin on the v2 rule API (docs/rule-api.md).

``text_stats`` declares two actions at analysis: ``Count`` (words of the sources, giving
a typed ``TextStatsInfo``) and ``Report`` (a Markdown report from Count's output), each
cached on its own, so changing the report title does not count again.
``text_ranking`` asks its dependencies for ``TextStatsInfo``: a target that does not
give it is refused at analysis, before anything runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from qbuild import AnalysisContext, Provider, Rule, RunContext, attr, hookimpl


@dataclass(frozen=True)
class TextStatsInfo(Provider):
    """Word statistics of a text target."""

    stats: Path  # the target's stats.json
    words: int
    longest: str = ""


def count(ctx: RunContext) -> TextStatsInfo:
    """Count words of at least ``min_length`` characters in the sources."""
    minimum = ctx.params["min_length"]
    words = [word for path in ctx.inputs["srcs"]
             for word in path.read_text(encoding="utf-8").split() if len(word) >= minimum]
    out = ctx.output("stats.json")
    longest = max(words, key=len, default="")
    out.write_text(json.dumps({"words": len(words), "longest": longest}) + "\n")
    return TextStatsInfo(out, len(words), longest)


def report(ctx: RunContext) -> None:
    """Write the report from Count's output (not from the sources)."""
    stats = json.loads(ctx.inputs["stats.json"].read_text(encoding="utf-8"))
    ctx.output("report.md").write_text(
        f"# {ctx.params['title']}\n\n{stats['words']} words; longest: {stats['longest']}\n")


class TextStats(Rule):
    """Word statistics and a report: two actions, one provider."""

    kind = "text_stats"
    version = 1
    doc = "Count words (stats.json, TextStatsInfo) and write a report (report.md)."
    attrs = {
        "srcs": attr.files(doc="Text files (globs allowed).", required=True),
        "min_length": attr.int(default=1, doc="Ignore words shorter than this."),
        "title": attr.string(default="Statistics", doc="Report title."),
    }
    outputs = ["stats.json", "report.md"]
    provides = (TextStatsInfo,)

    def analyze(self, ctx: AnalysisContext) -> None:
        if ctx.attrs["min_length"] < 1:
            raise ctx.fail("must be at least 1", attr="min_length")
        ctx.action(count, inputs=["srcs"], outputs=["stats.json"],
                   params={"min_length": ctx.attrs["min_length"]}, mnemonic="Count")
        ctx.action(report, inputs=["stats.json"], outputs=["report.md"],
                   params={"title": ctx.attrs["title"]}, mnemonic="Report")


def rank(ctx: RunContext) -> None:
    """Rank the dependencies by word count, reading only their providers."""
    infos = [dep[TextStatsInfo] for dep in ctx.inputs["texts"]]
    names = ctx.params["names"]
    rows = sorted(zip(names, infos), key=lambda row: (-row[1].words, row[0]))
    ctx.output("ranking.txt").write_text(
        "".join(f"{name} {info.words} {info.longest}\n" for name, info in rows))


class TextRanking(Rule):
    """Rank text_stats targets by word count."""

    kind = "text_ranking"
    version = 1
    doc = "Rank text_stats targets by their word count (ranking.txt)."
    attrs = {
        "texts": attr.label_list(doc="text_stats targets.", required=True,
                                 providers=[TextStatsInfo]),
    }
    outputs = ["ranking.txt"]

    def analyze(self, ctx: AnalysisContext) -> None:
        # Names are chosen at analysis and passed as params: actions never see labels.
        names = [label.rsplit(":", 1)[1] for label in ctx.attrs["texts"]]
        ctx.action(rank, inputs=["texts"], outputs=["ranking.txt"], params={"names": names},
                   mnemonic="Rank")


@hookimpl
def qbuild_rule_types() -> list[type[Rule]]:
    return [TextStats, TextRanking]
