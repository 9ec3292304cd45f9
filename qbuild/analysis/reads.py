"""What the full path read, stat by stat: the record the no-op fast path is built from.

Every file or directory the analysis looks at (``qbuild.toml``, BUILD files, directories
listed by a glob or a package walk, including the ones skipped for holding a nested
workspace) is stat'ed *before* it is read and noted here under its workspace-relative
path. A later change, even one racing the read, then shows as a different stat. Paths
outside the workspace keep their absolute form.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from ..core.files import stat_key


class Reads:
    """Stat keys noted as things were read; ``None`` means "absent when looked for"."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.stats: dict[str, str | None] = {}
        self.conflicting = False  # one path seen with two different stats

    def name(self, path: Path) -> str:
        try:
            return path.relative_to(self.root).as_posix()
        except ValueError:
            return str(path)

    def note(self, path: Path, key: str | None) -> None:
        name = self.name(path)
        if name in self.stats and self.stats[name] != key:
            self.conflicting = True
        self.stats[name] = key

    def stat(self, path: Path) -> str | None:
        """Stat ``path`` now and note it."""
        try:
            key = stat_key(os.stat(path))
        except OSError:
            key = None
        self.note(path, key)
        return key

    def listdir(self, path: Path) -> list[os.DirEntry[str]]:
        """The entries of directory ``path`` (none if unreadable), its stat noted first."""
        if self.stat(path) is None:
            return []
        try:
            with os.scandir(path) as entries:
                return list(entries)
        except OSError:
            return []


def folder_identities(root: Path, files: Iterable[str]) -> dict[str, str] | None:
    """(device, inode) of every folder from ``root`` down to each of ``files``
    (workspace-relative), taken with lstat; None if one is not a real folder. A folder
    swapped for a symlink (to where it was moved, say) changes this, though the stats of
    the files reached through it do not."""
    out: dict[str, str] = {}
    for rel in files:
        parent = rel.rpartition("/")[0]
        while parent not in out:
            try:
                st = os.lstat(os.path.join(root, parent) if parent else root)
            except OSError:
                return None
            if not stat.S_ISDIR(st.st_mode):
                return None
            out[parent] = f"{st.st_dev}:{st.st_ino}"
            if not parent:
                break
            parent = parent.rpartition("/")[0]
    return out


def same_folders(root: Path, folders: dict[str, str]) -> bool:
    """True if every folder in ``folders`` (from ``folder_identities``) is still the
    same real folder."""
    try:
        for rel, key in folders.items():
            st = os.lstat(os.path.join(root, rel) if rel else root)
            if not stat.S_ISDIR(st.st_mode) or f"{st.st_dev}:{st.st_ino}" != key:
                return False
    except OSError:
        return False
    return True
