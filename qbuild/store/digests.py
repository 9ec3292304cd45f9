"""Source digests: the digest of each source file a build reads, taken by stat.

A file is hashed only when its stat (``core.files.stat_key``) is new: ``SourceDigests``
looks the stat up in this process's record, then in what the workspace recorded last
time (``load_known``/``save_known``), then in the store's persistent stat memo
(``Memo``: the local store's ``memo/``), and remembers what it hashed there. It lives
with the store because the memo is the store's: the file functions it uses are
``core.files``'.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Protocol

from ..core.files import hash_file, is_racy, key_is_racy, stat_key


class Memo(Protocol):
    def memo_get(self, key: str) -> str | None: ...
    def memo_put(self, key: str, digest: str) -> None: ...


class SourceDigests:
    """Digests of source files, memoised persistently by stat. Counts bytes hashed.

    ``known`` (path -> (digest, stat key)) is what this workspace digested last time
    (``load_known``): the same stat-keyed memo as the cache's, read in one piece instead
    of one cache lookup per file."""

    def __init__(self, memo: Memo, known: dict[str, tuple[str, str]] | None = None) -> None:
        self._memo = memo
        self._known = known or {}
        self._lock = threading.Lock()
        self._seen: dict[str, tuple[str, str]] = {}
        self._modes: dict[str, int] = {}
        self._hashed: set[str] = set()  # stat keys whose digest this process computed
        self.bytes_hashed = 0
        self.files_hashed = 0

    def mode(self, path: str | Path) -> int:
        """``st_mode`` of ``path`` from the stat its digest was taken with."""
        mode = self._modes.get(str(path))
        return mode if mode is not None else os.stat(path).st_mode

    def digest(self, path: str | Path) -> tuple[str, str]:
        """Return (digest, stat key) of ``path``; hashes only if the stat is new."""
        st = os.stat(path)
        key = stat_key(st)
        self._modes[str(path)] = st.st_mode
        seen = self._seen.get(str(path))
        if seen is not None and seen[1] == key:
            return seen
        known = self._known.get(str(path))
        if known is not None and known[1] == key:
            self._seen[str(path)] = known
            return known
        digest = self._memo.memo_get(key)
        if digest is None:
            digest = hash_file(path)
            after = os.stat(path)
            if stat_key(after) != key:
                # Changed while we read it: hash again from a stable state.
                return self.digest(path)
            with self._lock:
                self.bytes_hashed += st.st_size
                self.files_hashed += 1
                self._hashed.add(key)
            if not is_racy(st.st_mtime_ns, st.st_ctime_ns, time.time()):
                self._memo.memo_put(key, digest)
        self._seen[str(path)] = (digest, key)
        return digest, key

    def hashed(self, key: str) -> bool:
        """Did this process take the digest for stat ``key`` by hashing the file? (If
        not, it came from a memo, which a damaged or tampered cache may have wrong.)"""
        return key in self._hashed

    def correct(self, key: str, digest: str) -> None:
        """The file of stat ``key`` was found to hold ``digest``, not what the memo
        said: remember the truth (memo and this workspace's record) from now on."""
        with self._lock:
            self._hashed.add(key)
            for path, (_old, seen_key) in list(self._seen.items()):
                if seen_key == key:
                    self._seen[path] = (digest, key)
        if not key_is_racy(key, time.time()):
            self._memo.memo_put(key, digest)

    def vouch(self, path: Path, digest: str, key: str) -> None:
        """Take ``digest`` for ``path`` as of stat ``key``, which the caller just saw
        unchanged since that digest was taken (``_incremental``)."""
        self._seen[str(path)] = (digest, key)

    def still(self, path: Path, expected_digest: str, expected_key: str) -> bool:
        """True if ``path`` was not touched since it was digested (re-checked after an
        action). Any stat change counts, even to the same bytes: a file edited and
        reverted while the action ran may have been read in its edited state."""
        try:
            st = os.stat(path)
        except OSError:
            return False
        if stat_key(st) != expected_key:
            return False
        if key_is_racy(expected_key, time.time()):
            return hash_file(path) == expected_digest  # the stat cannot vouch for it
        return True


def load_known(path: Path) -> dict[str, tuple[str, str]]:
    """The digests a workspace recorded with ``save_known`` (empty if absent or damaged)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return {name: (entry[0], entry[1]) for name, entry in data.items()
                if isinstance(entry, list) and len(entry) == 2
                and all(isinstance(x, str) for x in entry)}
    except (OSError, ValueError, AttributeError, TypeError):
        return {}


def save_known(path: Path, digests: SourceDigests, started: float) -> None:
    """Record the digests of this run's files whose stats can vouch for them (taken
    safely before ``started``), for the next run's ``SourceDigests(known=...)``."""
    entries = {name: [digest, key] for name, (digest, key) in digests._seen.items()
               if not key_is_racy(key, started)}
    if entries == {name: list(entry) for name, entry in digests._known.items()}:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        temp.write_text(json.dumps(entries), encoding="utf-8")
        os.replace(temp, path)
    except OSError:
        pass
