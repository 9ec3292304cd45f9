"""Progress inside running actions, as the console shows it on its live line.

An action reports ``ctx.progress(done, total)`` by replacing a small file in its
sandbox (it may run in a worker process); the engine registers that file under the
target's label while the action runs, and the console reads it when it redraws. An
action running on another machine (a Dask worker) has its progress sent back and
``report``-ed here instead.
"""

from __future__ import annotations

import threading
from pathlib import Path

PROGRESS_NAME = "_progress"  # the file in an action's sandbox

_lock = threading.Lock()
_files: dict[str, Path] = {}
_reported: dict[str, tuple[int, int]] = {}


def watch(label: str, path: Path) -> None:
    """``label``'s running action reports its progress in ``path``."""
    with _lock:
        _files[label] = path


def report(label: str, done: int, total: int) -> None:
    """``label``'s action, running elsewhere, said it is ``done`` of ``total``."""
    with _lock:
        _reported[label] = (int(done), int(total))


def forget(label: str) -> None:
    """``label``'s action ended: no progress to show."""
    with _lock:
        _files.pop(label, None)
        _reported.pop(label, None)


def read(label: str) -> tuple[int, int] | None:
    """(done, total) last reported by ``label``'s running action, if any."""
    with _lock:
        path = _files.get(label)
        reported = _reported.get(label)
    if path is None:
        return reported
    try:
        done, total = path.read_text(encoding="ascii").split()
        return int(done), int(total)
    except (OSError, ValueError):  # not written yet, or being replaced
        return None
