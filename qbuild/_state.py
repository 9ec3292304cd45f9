"""Per-workspace state kept under ``qbuild-out/.qbuild/``: the key each target was last
built with (for ``explain``) and what was materialized where (so a no-op build neither
copies nor hashes outputs). Losing it is harmless: it only costs re-verification.
"""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path
from typing import Any

from ._digest import key_is_racy, stat_key


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

    def in_place(self, output_dir: Path, base_rel: str,
                 entries: list[tuple[str, str, bool]]) -> bool:
        """True if a target's output folder holds exactly ``entries`` (flat), each
        file as placed and recorded, and nothing else: its stat is the one recorded
        after it was cleaned, and no folder on the way is a symlink. Then there is
        nothing to copy, hash or delete."""
        names = sorted(path for path, _digest, _executable in entries)
        folder = self.folders.get(base_rel)
        if folder is None or folder[1] != names or any("/" in name for name in names):
            return False
        top = f"{output_dir}/"
        parts = base_rel.split("/")
        try:
            for depth in range(1, len(parts)):
                rel = "/".join(parts[:depth])
                if rel not in self._real_dirs:
                    if not stat.S_ISDIR(os.lstat(top + rel).st_mode):
                        return False
                    self._real_dirs.add(rel)
            st = os.lstat(top + base_rel)
            if not stat.S_ISDIR(st.st_mode) or stat_key(st) != folder[0]:
                return False
            for path, digest, executable in entries:
                rel = f"{base_rel}/{path}"
                record = self.materialized.get(rel)
                if record is None or record[0] != digest or record[2] != executable:
                    return False
                st = os.lstat(top + rel)
                if not stat.S_ISREG(st.st_mode) or stat_key(st) != record[1] or \
                        bool(st.st_mode & stat.S_IXUSR) != executable or st.st_mode & 0o222:
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
