"""Source globs (``*``, ``?``, ``[...]`` per path segment, ``**`` for any depth) that note
every directory they list, so the no-op fast path can tell when a new match appears.

Semantics follow ``pathlib.Path.glob``: matching is case-sensitive, ``*`` also matches
names starting with a dot, ``**`` does not descend through symlinked directories.
Directories in ``skip`` (the output and cache folders) are never entered.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path

from .reads import Reads

_GLOB_CHARS = set("*?[")


def has_magic(text: str) -> bool:
    return bool(_GLOB_CHARS & set(text))


def glob_files(base: Path, pattern: str, reads: Reads, skip: set[Path]) -> list[Path]:
    """Files under ``base`` matching ``pattern``, sorted."""
    segments = [s for s in pattern.split("/") if s not in ("", ".")]
    current = [base]
    for index, segment in enumerate(segments):
        last = index == len(segments) - 1
        found: list[Path] = []
        for directory in current:
            found.extend(_step(directory, segment, last, reads, skip))
        current = list(dict.fromkeys(found))
    return sorted(p for p in current if p.is_file())


def _step(directory: Path, segment: str, last: bool, reads: Reads, skip: set[Path]
          ) -> list[Path]:
    if segment == "**":
        out = []
        stack = [directory]
        while stack:
            here = stack.pop()
            out.append(here)
            for entry in reads.listdir(here):
                child = here / entry.name
                if child in skip:
                    continue
                try:
                    if entry.is_dir() and not entry.is_symlink():
                        stack.append(child)
                except OSError:
                    continue
        return out  # directories: a trailing '**' matches no file, as in pathlib
    if not has_magic(segment):
        reads.stat(directory)  # its stat moves when the named entry comes or goes
        child = directory / segment
        return [] if child in skip else [child]
    out = []
    for entry in reads.listdir(directory):
        child = directory / entry.name
        if child in skip or not fnmatch.fnmatchcase(entry.name, segment):
            continue
        if not last:
            try:
                if not entry.is_dir():
                    continue
            except OSError:
                continue
        out.append(child)
    return out
