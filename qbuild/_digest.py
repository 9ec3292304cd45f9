"""Content digests (SHA-256, the digest Bazel's remote cache speaks) and the persistent
stat memo that lets a no-op build hash zero bytes.

The memo maps (device, inode, size, mtime_ns, ctime_ns) to a digest. ctime is part of
the key because an in-place edit that restores the mtime still moves the ctime, which
no user tool can set back. A file changed within the last few milliseconds is not
memoised: the filesystem clock is coarse, so a second edit in the same tick could keep
every stat field equal.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path
from typing import Protocol

_CHUNK = 1 << 20
_RACY_SECONDS = 0.05


def hash_file(path: str | os.PathLike[str]) -> str:
    """SHA-256 of a file, streamed in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


_FICLONE = 0x40049409  # linux/fs.h: share the source's extents (btrfs, XFS, bcachefs)
_NO_REFLINK: set[int] = set()


def clone_or_copy(source: str | os.PathLike[str], dest: str | os.PathLike[str]) -> None:
    """Make ``dest`` a private copy of ``source``: a reflink where the filesystem can
    (no data read or written; a later write to either file unshares it), else a copy."""
    device = os.stat(source).st_dev
    if device not in _NO_REFLINK:
        try:
            import fcntl

            with open(source, "rb") as src, open(dest, "wb") as dst:
                fcntl.ioctl(dst.fileno(), _FICLONE, src.fileno())
            return
        except (OSError, ImportError):
            _NO_REFLINK.add(device)  # do not ask this filesystem again
    import shutil

    shutil.copyfile(source, dest)


def copy_hashing(source: str | os.PathLike[str], dest: str | os.PathLike[str]) -> str:
    """Copy ``source`` to a new file ``dest`` and return the SHA-256 of what was copied
    (one read of the source for both)."""
    digest = hashlib.sha256()
    with open(source, "rb") as src, open(dest, "xb") as dst:
        while chunk := src.read(_CHUNK):
            digest.update(chunk)
            dst.write(chunk)
    return digest.hexdigest()


def hash_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def stat_key(st: os.stat_result) -> str:
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


class Memo(Protocol):
    def memo_get(self, key: str) -> str | None: ...
    def memo_put(self, key: str, digest: str) -> None: ...


class SourceDigests:
    """Digests of source files, memoised persistently by stat. Counts bytes hashed."""

    def __init__(self, memo: Memo) -> None:
        self._memo = memo
        self._lock = threading.Lock()
        self._seen: dict[str, tuple[str, str]] = {}
        self.bytes_hashed = 0
        self.files_hashed = 0

    def digest(self, path: Path) -> tuple[str, str]:
        """Return (digest, stat key) of ``path``; hashes only if the stat is new."""
        st = os.stat(path)
        key = stat_key(st)
        seen = self._seen.get(str(path))
        if seen is not None and seen[1] == key:
            return seen
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
            newest = max(st.st_mtime_ns, st.st_ctime_ns) / 1e9
            if time.time() - newest > _RACY_SECONDS:
                self._memo.memo_put(key, digest)
        self._seen[str(path)] = (digest, key)
        return digest, key

    def still(self, path: Path, expected_digest: str, expected_key: str) -> bool:
        """True if ``path`` still has the content it had (re-checked after an action)."""
        self._seen.pop(str(path), None)
        try:
            st = os.stat(path)
        except OSError:
            return False
        if stat_key(st) == expected_key:
            return True
        return self.digest(path)[0] == expected_digest
