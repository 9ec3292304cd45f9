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
        "notes": attr.string_list(doc="Free notes."),
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
    """Sleeps, then writes; writes a marker file named by $TOY_STARTED when it starts and
    first waits (at most 60 s) for a file named by $TOY_WAIT_FOR to exist."""

    kind = "slow"
    attrs = {"seconds": attr.float(default=1.0, doc="How long."),
             "srcs": attr.files(doc="Inputs.")}
    outputs = ["out.txt"]

    def run(self, ctx: ActionContext) -> dict[str, Any]:
        marker = os.environ.get("TOY_STARTED")
        if marker:
            open(marker, "w").close()
        event = os.environ.get("TOY_WAIT_FOR")
        deadline = time.monotonic() + 60
        while event and not os.path.exists(event) and time.monotonic() < deadline:
            time.sleep(0.01)
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


class Exit(Rule):
    """Calls sys.exit (or raises a BaseException) from run()."""

    kind = "exits"
    attrs = {"how": attr.enum(["exit0", "base"], default="exit0", doc="What to raise.")}
    outputs = ["out.txt"]

    def run(self, ctx: ActionContext) -> dict[str, Any]:
        import sys

        if ctx.attrs["how"] == "exit0":
            sys.exit(0)
        raise BaseException("a bare BaseException")


class Noisy(Rule):
    """Writes the time: not reproducible when ``noisy`` is set."""

    kind = "noisy"
    attrs = {"noisy": attr.bool(default=True, doc="Declare non-reproducible.")}
    outputs = ["t.txt"]

    def is_reproducible(self, attrs: Any) -> bool:
        return not attrs["noisy"]

    def run(self, ctx: ActionContext) -> dict[str, Any]:
        ctx.output("t.txt").write_text(f"{time.time_ns()}\n")
        return {}


class Worker(Rule):
    """Runs in a worker process: records its pid, sleeps, then maybe kills its process."""

    kind = "worker"
    heavy = True
    attrs = {"seconds": attr.float(default=0.0, doc="Sleep."),
             "die": attr.bool(default=False, doc="SIGKILL the worker (as the OOM killer)."),
             "pid_dir": attr.string(default="", doc="Write the worker pid in a file here."),
             "started": attr.string(default="", doc="Create this file when started."),
             "wait_for": attr.string(default="", doc="Then wait until this file exists "
                                     "(an event another action gives; at most 60 s)."),
             "ending": attr.string(default="", doc="Create this file just before ending "
                                   "(or dying)."),
             "deps": attr.label_list(doc="Run after these.")}
    outputs = ["out.txt"]

    def run(self, ctx: ActionContext) -> dict[str, Any]:
        import signal

        if ctx.attrs["pid_dir"]:
            with open(os.path.join(ctx.attrs["pid_dir"], f"{os.getpid()}.pid"), "w"):
                pass
        if ctx.attrs["started"]:
            open(ctx.attrs["started"], "a").close()
        deadline = time.monotonic() + 60
        while ctx.attrs["wait_for"] and not os.path.exists(ctx.attrs["wait_for"]) \
                and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(ctx.attrs["seconds"])
        if ctx.attrs["ending"]:
            open(ctx.attrs["ending"], "a").close()
        if ctx.attrs["die"]:
            os.kill(os.getpid(), signal.SIGKILL)
        ctx.output("out.txt").write_text(f"{ctx.name}\n")
        return {"pid": os.getpid()}
class FloatEcho(Rule):
    """Writes the repr of its float attributes (default written as an int)."""

    kind = "float_echo"
    attrs = {"x": attr.float(default=1, doc="A number."),
             "xs": attr.float_list(default=[2], doc="Numbers.")}
    outputs = ["f.txt"]

    def run(self, ctx: ActionContext) -> dict[str, Any]:
        ctx.output("f.txt").write_text(f"{ctx.attrs['x']!r} {ctx.attrs['xs']!r}")
        return {}


class Names(Rule):
    """Writes one file per name (content: the name), in the order given; returns no info."""

    kind = "names"
    attrs = {"names": attr.string_list(required=True, doc="File names.")}

    def declared_outputs(self, name: str, attrs: Any) -> list[str]:
        return list(attrs["names"])

    def run(self, ctx: ActionContext) -> dict[str, Any]:
        for name in ctx.attrs["names"]:
            ctx.output(name).write_text(name.upper())
        return {}


class Vandal(Rule):
    """Overwrites its inputs (a source file and a dependency's outputs), then writes."""

    kind = "vandal"
    attrs = {"srcs": attr.files(doc="Inputs to overwrite."),
             "deps": attr.label_list(doc="Dependencies whose files to overwrite.")}
    outputs = ["out.txt"]

    def run(self, ctx: ActionContext) -> dict[str, Any]:
        victims = list(ctx.attrs["srcs"]) + [f for d in ctx.attrs["deps"] for f in d.files]
        for path in victims:
            os.chmod(path, 0o644)
            path.write_text("VANDALISED")
        ctx.output("out.txt").write_text("done")
        return {}


class Random(Rule):
    """Not reproducible: writes fresh random bytes every run."""

    kind = "random"
    outputs = ["r.txt"]

    def run(self, ctx: ActionContext) -> dict[str, Any]:
        ctx.output("r.txt").write_text(os.urandom(8).hex())
        return {}


class Span(Rule):
    """Sleeps; writes its granted threads and when it started and ended."""

    kind = "span"
    attrs = {"cores": attr.int(default=1, doc="Cores it needs."),
             "mib": attr.int(default=0, doc="Memory it needs."),
             "gpus": attr.int(default=0, doc="GPUs it needs (placement only)."),
             "seconds": attr.float(default=0.3, doc="How long.")}
    outputs = ["span.txt"]

    def resources(self, attrs: Any) -> tuple[int, int]:
        return attrs["cores"], attrs["mib"]

    def accelerators_for(self, attrs: Any) -> dict[str, float]:
        return {"GPU": attrs["gpus"]} if attrs["gpus"] else {}

    def run(self, ctx: ActionContext) -> dict[str, Any]:
        start = time.time()
        time.sleep(ctx.attrs["seconds"])
        ctx.output("span.txt").write_text(f"{ctx.threads} {start} {time.time()}")
        return {}


class Warn(Rule):
    """Always warns, naming its own label (as real rules often do)."""

    kind = "warn"
    attrs = {"n": attr.string(default="", doc="Anything.")}
    outputs = ["w.txt"]

    def run(self, ctx: ActionContext) -> dict[str, Any]:
        ctx.warn("this toy always warns")
        ctx.output("w.txt").write_text(ctx.attrs["n"])
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
    return [Concat, Heavy, Length, Fail, Slow, Tree, Undeclared, Exit, Noisy, Worker, FloatEcho,
            Names, Vandal, Random, Span, Warn, Twice]
