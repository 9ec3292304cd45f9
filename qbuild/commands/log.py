"""``qbuild log``: the log of the last run of each action of targets, read from the
cache (where a successful action's log is kept with its result, locally and on the
remote cache), like Bazel's ``bazel-testlogs``."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.labels import Label


@dataclass(frozen=True)
class ActionLog:
    """One action's log: its target, mnemonic, and the text (None: ``note`` says why
    there is none)."""

    target: str
    mnemonic: str
    text: str | None
    note: str = ""


def action_logs(session: Any, roots: list[Label]) -> list[ActionLog]:
    """The log of each action of ``roots`` (matrix groups expanded), in action order."""
    from .aquery import actions

    logs: list[ActionLog] = []
    with tempfile.TemporaryDirectory(prefix="qbuild-log-") as folder:
        for index, rec in enumerate(actions(session, roots)):
            target, mnemonic = rec["target"], rec["mnemonic"]
            result = session.store.get_action(rec["key"]) if rec["key"] else None
            if result is None:
                logs.append(ActionLog(target, mnemonic, None,
                                      f"not built: no cached result (qbuild build {target})"))
            elif result.log is None:
                logs.append(ActionLog(target, mnemonic, "", "it logged nothing"))
            else:
                dest = Path(folder) / str(index)
                if session.store.restore_blob(result.log.digest, dest):
                    logs.append(ActionLog(target, mnemonic,
                                          dest.read_text(encoding="utf-8", errors="replace")))
                else:
                    logs.append(ActionLog(target, mnemonic, None, "its log is no longer in "
                                          "the cache (evicted by gc?)"))
    return logs
