"""Rules for the distributed tests: one that blocks until its worker is killed (the retry,
seeing the marker the first run left, finishes at once with the same bytes), and one that
reports its progress and waits until the test has seen it."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from qbuild import ActionContext, Rule, attr, hookimpl


class Block(Rule):
    """Write the first run's process id to ``markers``/started, then block; a later run
    (the retry on another worker) writes the output at once."""

    kind = "block"
    attrs = {"markers": attr.string(required=True, doc="A folder outside the sandbox."),
             "text": attr.string(default="done", doc="What to write.")}
    outputs = ["out.txt"]

    def run(self, ctx: ActionContext) -> dict[str, Any]:
        started = Path(ctx.attrs["markers"]) / "started"
        if not started.exists():
            started.write_text(str(os.getpid()))
            time.sleep(60)  # the test kills this worker long before
        ctx.log("the retry wrote the output")
        ctx.output("out.txt").write_text(ctx.attrs["text"])
        return {"length": len(ctx.attrs["text"])}


class GpuBlock(Block):
    """``block``, needing a GPU: only a worker offering one can run it."""

    kind = "gpu_block"
    accelerators = {"GPU": 1.0}


class Progress(Rule):
    """Report 2 of 5 done, then wait (60 s at most) for the file ``release`` before
    writing the output."""

    kind = "progress"
    heavy = True
    attrs = {"release": attr.string(required=True, doc="A file outside the sandbox.")}
    outputs = ["out.txt"]

    def run(self, ctx: ActionContext) -> None:
        ctx.progress(2, 5)
        release = Path(ctx.attrs["release"])
        deadline = time.monotonic() + 60
        while not release.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        ctx.output("out.txt").write_text("released" if release.exists() else "timed out")


@hookimpl
def qbuild_rule_types() -> list[type[Rule]]:
    return [Block, GpuBlock, Progress]
