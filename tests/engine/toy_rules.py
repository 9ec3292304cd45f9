"""A toy plugin for engine tests: rules that concatenate text, pass info along, fail on
request or run slowly, so tests can watch what the engine runs."""

from __future__ import annotations

import os
import time
from typing import Any

from qbuild import ActionContext, Rule, RuleError, attr, hookimpl


class Concat(Rule):
    """Concatenate source files and dependency outputs into out.txt."""

    kind = "concat"
    version = 1
    doc = "Concatenate inputs."
    attrs = {
        "srcs": attr.files(doc="Text files."),
        "deps": attr.label_list(doc="Targets whose outputs are appended."),
        "sep": attr.string(default="", doc="Separator."),
        "upper": attr.bool(default=False, doc="Upper-case the result."),
        "repeat": attr.int(default=1, doc="Repeat the result."),
        "scale": attr.float(default=1.0, doc="Unused number."),
        "mode": attr.enum(["plain", "fancy"], default="plain", doc="A mode."),
        "tags": attr.string_list(doc="Tags."),
        "extra": attr.mapping(doc="A table."),
    }
    outputs = ["out.txt"]

    def run(self, ctx: ActionContext) -> dict[str, Any]:
        parts = [p.read_text() for p in ctx.attrs["srcs"]]
        for dep in ctx.attrs["deps"]:
            parts.append(dep.output("out.txt").read_text() if "out.txt" in
                         [f.name for f in dep.files] else dep.files[0].read_text())
        text = ctx.attrs["sep"].join(parts) * ctx.attrs["repeat"]
        if ctx.attrs["upper"]:
            text = text.upper()
        ctx.output("out.txt").write_text(text)
        ctx.log(f"wrote {len(text)} characters")
        return {"length": len(text)}


class Heavy(Concat):
    """Like concat, but in a worker process."""

    kind = "heavy_concat"
    heavy = True


class Length(Rule):
    """Writes the length its dependency reported through info (no file reading)."""

    kind = "length"
    attrs = {"dep": attr.label(required=True, doc="A concat target.")}
    outputs = ["{name}.len"]

    def run(self, ctx: ActionContext) -> dict[str, Any]:
        ctx.output("{name}.len").write_text(str(ctx.attrs["dep"].info["length"]))
        return {}


class Fail(Rule):
    """Writes part of its output, logs, then fails."""

    kind = "fail"
    attrs = {"message": attr.string(default="boom", doc="Error message."),
             "crash": attr.bool(default=False, doc="Raise a plain exception instead.")}
    outputs = ["out.txt"]

    def run(self, ctx: ActionContext) -> dict[str, Any]:
        ctx.output("out.txt").write_text("partial")
        ctx.log("step 1 done")
        ctx.log("step 2 about to fail")
        if ctx.attrs["crash"]:
            raise ZeroDivisionError("division by zero in the rule")
        raise ctx.fail(ctx.attrs["message"], attr="message")


class Slow(Rule):
    """Sleeps, then writes; writes a marker file named by $TOY_STARTED when it starts."""

    kind = "slow"
    attrs = {"seconds": attr.float(default=1.0, doc="How long."),
             "srcs": attr.files(doc="Inputs.")}
    outputs = ["out.txt"]

    def run(self, ctx: ActionContext) -> dict[str, Any]:
        marker = os.environ.get("TOY_STARTED")
        if marker:
            open(marker, "w").close()
        time.sleep(ctx.attrs["seconds"])
        text = "".join(p.read_text() for p in ctx.attrs["srcs"])
        ctx.output("out.txt").write_text(f"slept {ctx.attrs['seconds']}\n{text}")
        return {}


class Tree(Rule):
    """Writes a directory output with n files."""

    kind = "tree"
    attrs = {"n": attr.int(default=2, doc="Files.")}
    outputs = ["data/"]

    def run(self, ctx: ActionContext) -> dict[str, Any]:
        for i in range(ctx.attrs["n"]):
            (ctx.output("data/") / f"f{i}.txt").write_text(str(i))
        return {"n": ctx.attrs["n"]}


class Undeclared(Rule):
    kind = "forgetful"
    outputs = ["a.txt", "b.txt"]

    def run(self, ctx: ActionContext) -> dict[str, Any]:
        ctx.output("a.txt").write_text("a")
        return {}


def check_error_type() -> type[RuleError]:
    return RuleError


class Twice(Rule):
    """A macro: expands to <name>.first and <name>.second (concat targets of `srcs`, the
    second upper-cased) and itself joins them with `sep`."""

    kind = "twice"
    version = 1
    doc = "Concatenate two generated targets."
    attrs = {
        "srcs": attr.files(doc="Text files."),
        "sep": attr.string(default="|", doc="Separator."),
        "parts": attr.label_list(doc="(generated)"),
    }
    outputs = ["out.txt"]

    @staticmethod
    def expand_targets(name: str, raw: dict[str, Any]):
        from qbuild import ConfigError

        if "parts" in raw:
            raise ConfigError("is generated", attr="parts")
        extra = {f"{name}.first": {"rule": "concat", "srcs": raw.get("srcs", [])},
                 f"{name}.second": {"rule": "concat", "srcs": raw.get("srcs", []),
                                    "upper": True}}
        return extra, {**raw, "parts": [f":{name}.first", f":{name}.second"]}

    def run(self, ctx: ActionContext) -> dict[str, Any]:
        text = ctx.attrs["sep"].join(d.output("out.txt").read_text() for d in ctx.attrs["parts"])
        ctx.output("out.txt").write_text(text)
        return {}


@hookimpl
def qbuild_rule_types() -> list[type[Rule]]:
    return [Concat, Heavy, Length, Fail, Slow, Tree, Undeclared, Twice]
