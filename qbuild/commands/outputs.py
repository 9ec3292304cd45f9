"""``qbuild outputs``: where the outputs of targets are (or will be) under qbuild-out/,
from analysis alone, so scripts need not parse ``qbuild build``'s output."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..core.labels import output_folder

if TYPE_CHECKING:
    from ..build.session import Session


def declared_paths(session: Session, patterns: list[str], package: str | None) -> list[Path]:
    """The declared output paths of the targets ``patterns`` name, matrix groups
    expanded to their variants, in the order ``qbuild build`` prints them."""
    graph = session.graph
    roots = graph.expand(patterns, package)
    graph.analyze(roots)
    paths: list[Path] = []
    pending = list(roots)
    seen = set()
    while pending:
        label = pending.pop(0)
        if label in seen:
            continue
        seen.add(label)
        target = graph.targets[label]
        if target.is_group:
            pending[:0] = target.deps
            continue
        base = session.workspace.output_dir / output_folder(label)
        paths.extend(base / name.rstrip("/") for name in target.outputs)
    return paths
