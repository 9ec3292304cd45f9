"""Per-workspace state kept under ``qbuild-out/.qbuild/``: the key each target was last
built with (for ``explain``) and what was materialized where (so a no-op build neither
copies nor hashes outputs). Losing it is harmless: it only costs re-verification.
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..core.files import key_is_racy, stat_key
from ..core.records import OutputEntry

lstat = os.lstat
S_ISDIR, S_ISREG, S_IXUSR = stat.S_ISDIR, stat.S_ISREG, stat.S_IXUSR


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
        # output folder -> [its stat key, the file names it holds], taken after it was
        # cleaned of everything else (see ``in_place``)
        folders = data.get("folders")
        self.folders: dict[str, list[Any]] = {
            k: v for k, v in (folders.items() if isinstance(folders, dict) else ())
            if isinstance(v, list) and len(v) == 2 and isinstance(v[0], str)
            and isinstance(v[1], list) and all(isinstance(x, str) for x in v[1])}
        self._real_dirs: set[str] = set()  # folders seen to be real (no link) this run
        self._dirty = False

    def in_place(self, output_dir: Path, base_rel: str, outputs: Sequence[OutputEntry]
                 ) -> bool:
        """True if a target's output folder holds exactly ``outputs`` (flat), each file
        as placed and recorded, and nothing else: its stat is the one recorded after it
        was cleaned, and no folder on the way is a symlink. Then there is nothing to
        copy, hash or delete."""
        folder = self.folders.get(base_rel)
        if folder is None:
            return False
        names = folder[1]
        if len(names) != len(outputs):
            return False
        if len(outputs) == 1:
            if names[0] != outputs[0].path or "/" in names[0]:
                return False
        elif names != sorted(entry.path for entry in outputs) or \
                any("/" in name for name in names):
            return False
        top = f"{output_dir}/"
        materialized = self.materialized
        try:
            parent = base_rel.rpartition("/")[0]
            if parent and parent not in self._real_dirs:
                parts = base_rel.split("/")
                for depth in range(1, len(parts)):
                    rel = "/".join(parts[:depth])
                    if rel not in self._real_dirs:
                        if not S_ISDIR(lstat(top + rel).st_mode):
                            return False
                        self._real_dirs.add(rel)
            st = lstat(top + base_rel)
            if not S_ISDIR(st.st_mode) or stat_key(st) != folder[0]:
                return False
            for entry in outputs:
                rel = f"{base_rel}/{entry.path}"
                record = materialized.get(rel)
                if record is None or record[0] != entry.digest or \
                        record[2] != entry.executable:
                    return False
                st = lstat(top + rel)
                mode = st.st_mode
                if not S_ISREG(mode) or stat_key(st) != record[1] or \
                        bool(mode & S_IXUSR) != entry.executable or mode & 0o222:
                    return False
        except OSError:
            return False
        return True

    def set_folder(self, output_dir: Path, base_rel: str, names: list[str]) -> None:
        """Record a target's output folder just cleaned to hold only ``names``; not
        when its stat is too recent to show a later change."""
        try:
            key = stat_key(os.lstat(os.path.join(output_dir, base_rel)))
        except OSError:
            key = None
        record = [key, sorted(names)] if key and not key_is_racy(key, time.time()) else None
        if record is None:
            if self.folders.pop(base_rel, None) is not None:
                self._dirty = True
        elif self.folders.get(base_rel) != record:
            self.folders[base_rel] = record
            self._dirty = True

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
                                    "materialized": self.materialized,
                                    "folders": self.folders}, sort_keys=True),
                        encoding="utf-8")
        os.replace(temp, self.path)
        self._dirty = False
