"""Example qbuild plugin: ``word_count`` counts the words of text files.

This is the worked example of the plugin authoring guide (README.md, "Writing a
plugin"): one rule class, one hook, and a test written with ``qbuild.testing``.
"""

from __future__ import annotations

from typing import Any

from qbuild import ActionContext, Rule, attr, hookimpl


class WordCount(Rule):
    """Count words (optionally only those at least `min_length` long)."""

    kind = "word_count"
    version = 1
    doc = "Count the words in text files and write the total to {name}.count."
    attrs = {
        "srcs": attr.files(doc="Text files (globs allowed).", required=True),
        "min_length": attr.int(default=1, doc="Ignore words shorter than this."),
    }
    outputs = ["{name}.count"]

    def run(self, ctx: ActionContext) -> dict[str, Any]:
        if ctx.attrs["min_length"] < 1:
            raise ctx.fail("must be at least 1", attr="min_length")
        total = 0
        for path in ctx.attrs["srcs"]:
            words = path.read_text(encoding="utf-8").split()
            total += sum(1 for word in words if len(word) >= ctx.attrs["min_length"])
        ctx.output("{name}.count").write_text(f"{total}\n")
        return {"words": total}  # dependents read this without opening the file


@hookimpl
def qbuild_rule_types() -> list[type[Rule]]:
    return [WordCount]
