"""How running an action fails: ``ActionFailed`` (the action itself failed; shown to the
user with the end of its log) and ``MissingBlob`` (a dependency's output is gone from
the store, so that dependency must be built again), and ``log_tail``, the end of an
action's log that goes with a failure.

Every executor raises these (through the future ``submit`` returns), and the build
catches them: they live apart from the executors so that both sides can import them.
"""

from __future__ import annotations

from pathlib import Path

from ..core.errors import QbuildError


class ActionFailed(Exception):
    """The action failed; ``error`` is user-facing, ``log_tail`` the end of its log.
    ``started``: False when it failed before its rule's code ran (its inputs could not
    be staged or restored, every worker refused it, no worker could take it), so the
    summary says it could not start rather than that it ran."""

    def __init__(self, error: QbuildError | str, log_tail: str = "", where: str = "",
                 started: bool = True) -> None:
        super().__init__(str(error))
        self.error = error
        self.log_tail = log_tail
        # where it ran ("on worker tcp://..."): shown to the user, never part of the
        # reason a tolerating dependent is given (that reason is in its key)
        self.where = where
        self.started = started


class MissingBlob(Exception):
    """A dependency's output blob is missing or corrupt: the dependency must rebuild."""

    def __init__(self, dep_label: str) -> None:
        super().__init__(dep_label)
        self.dep_label = dep_label  # as the action's ``deps`` name it


def log_tail(path: Path, lines: int = 20) -> str:
    """The last ``lines`` lines of the log at ``path`` ("" if it cannot be read)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip("\n").splitlines()[-lines:])
