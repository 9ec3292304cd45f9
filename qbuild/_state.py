"""Per-workspace state kept under ``qbuild-out/.qbuild/``: the key each target was last
built with (for ``explain``) and what was materialized where (so a no-op build neither
copies nor hashes outputs). Losing it is harmless: it only costs re-verification.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


class WorkspaceState:
    def __init__(self, output_dir: Path) -> None:
        self.path = output_dir / ".qbuild" / "state.json"
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            data = {}
        if not isinstance(data, dict):
            data = {}
        keys, placed = data.get("last_keys"), data.get("materialized")
        # Entries of another shape (damage, another version) are dropped, never trusted.
        self.last_keys: dict[str, str] = {
            k: v for k, v in (keys.items() if isinstance(keys, dict) else ())
            if isinstance(k, str) and isinstance(v, str)}
        # [digest, stat key, executable], as ``Build._place`` writes them.
        self.materialized: dict[str, list[Any]] = {
            k: v for k, v in (placed.items() if isinstance(placed, dict) else ())
            if isinstance(v, list) and len(v) == 3 and isinstance(v[0], str)
            and isinstance(v[1], str) and isinstance(v[2], bool)}
        self._dirty = False

    def set_last_key(self, label: str, key: str) -> None:
        if self.last_keys.get(label) != key:
            self.last_keys[label] = key
            self._dirty = True

    def set_materialized(self, rel: str, record: list[Any] | None) -> None:
        if record is None:
            if self.materialized.pop(rel, None) is not None:
                self._dirty = True
        elif self.materialized.get(rel) != record:
            self.materialized[rel] = record
            self._dirty = True

    def save(self) -> None:
        if not self._dirty:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temp = self.path.with_name(f"state.{os.getpid()}.tmp")
        temp.write_text(json.dumps({"last_keys": self.last_keys,
                                    "materialized": self.materialized}, sort_keys=True),
                        encoding="utf-8")
        os.replace(temp, self.path)
        self._dirty = False
