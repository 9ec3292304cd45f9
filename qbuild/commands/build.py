"""``qbuild build``, composed once: what a build does around the build loop.

The command line and ``qbuild.testing.Workspace.build`` both call ``full_build``: check
the ``[toolchain]`` pins, load the source-digest memo, sweep stale sandboxes, run the
build over the session, save the memo, and record the no-op snapshot a later build
answers from. Only what differs between the two stays with the caller: parsing flags
into ``BuildOptions``, the reporter, and the fast no-op check (a command-line shortcut
taken before any session is opened).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..build.progress import Reporter
from ..build.run import Build, BuildOptions
from ..build.session import Session
from ..execution.sandbox import clean_stale_sandboxes
from ..keys import environ
from ..keys.toolchain import check as check_toolchain
from ..shortcuts.noop import forget, record
from ..store.digests import load_known, save_known


@dataclass(frozen=True)
class BuildRequest:
    """One build as the caller asks for it."""

    patterns: list[str]
    package: str | None
    options: BuildOptions
    started: float
    """Wall-clock start of the build (the shortcuts compare file times against it)."""
    environment: dict[str, Any] | None = None
    """The facts outside the workspace the shortcuts depend on (``shortcuts.noop
    .environment``); None takes the full path and records no snapshot."""
    toolchain_mismatch: str = "error"


@dataclass
class BuildRun:
    """A finished ``full_build``: the build, and the outputs it printed in order."""

    build: Build
    lines: list[str]
    """Requested outputs, workspace-relative with ``/`` (what the fast path prints)."""
    paths: list[str]
    """The same outputs as absolute paths."""


def full_build(session: Session, request: BuildRequest, reporter: Reporter,
               warn: Callable[[str], None]) -> BuildRun:
    """Run ``request`` over ``session`` with everything a user's build does around it."""
    workspace = session.workspace
    known_file = workspace.output_dir / ".qbuild" / "digests.json"
    session.known_digests = load_known(known_file)
    environ.forget()  # the variables this build's key facts read, recorded with it
    warnings: list[str] = []  # recorded: the fast path repeats them, or stops as we would

    def warn_and_note(line: str) -> None:
        warnings.append(line)
        warn(line)

    check_toolchain(dict(workspace.toolchain), request.toolchain_mismatch,
                    workspace.root / "qbuild.toml", warn_and_note)
    forget(workspace.output_dir, request.patterns, request.package)
    clean_stale_sandboxes(session.store.tmp)
    build = session.build(request.patterns, request.package, request.options, reporter,
                          started=request.started if request.environment is not None
                          else None, incremental=request.environment)
    result = build.result
    save_known(known_file, session.digests, request.started)
    lines, paths = [], []
    root_prefix = len(str(workspace.root)) + 1
    for label in result.requested:
        for path in result.outputs.get(label, []):
            paths.append(path)
            lines.append(path[root_prefix:].replace(os.sep, "/"))
    reads = build.reads()
    if result.ok and reads is not None and request.environment is not None:
        record(workspace.root, workspace.output_dir, request.patterns, request.package,
               reads=reads, outputs=build.placed_outputs(), started=request.started,
               env=request.environment, lines=lines,
               summary={"targets": len(result.requested),
                        "actions": len(result.ran) + len(result.cached),
                        "cache_dir": str(session.store.directory),
                        "cache_bytes": session.store.volume(), "warnings": warnings},
               code_files=sorted(build.code_files()), sources=build.source_files())
    return BuildRun(build, lines, paths)
