"""Action key locks: one process runs a key at a time, across processes sharing a cache.

A key is locked through one of 4,096 shared lock files (``locks/<first three hex digits
of the key>``, taken with ``flock``), not one new file per key. Inside one process the
lock file of a prefix is taken once and shared by every key of that prefix the process
holds: a key waits only for the same key (in another thread, or in another process
through the file), never for another key of this process that happens to share its
prefix. Without that, an action whose key shared a prefix with an entry waiting for its
batched commit (which holds its lock until the blobs are durable) waited for the whole
fsync pass: thousands of times in a cold build of 10,000 targets.

``flock_fd`` is the one way qbuild takes an ``flock`` (key lock files here, sandbox
folders and their lock files in ``_executor``).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path


class KeyLock:
    """A held key lock; ``release`` it once (the last key of its prefix in this process
    releases the lock file)."""

    __slots__ = ("_owner", "key", "_released")

    def __init__(self, owner: KeyLocks, key: str) -> None:
        self._owner = owner
        self.key = key
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._owner._release(self.key)


class _Prefix:
    __slots__ = ("fd", "keys")

    def __init__(self) -> None:
        self.fd: int | None = None  # None while one thread is taking the file lock
        self.keys: set[str] = set()


class KeyLocks:
    """The key locks of one process over the lock files in ``folder``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._cond = threading.Condition()
        self._held: dict[str, _Prefix] = {}

    def acquire(self, key: str) -> KeyLock | None:
        """Lock ``key`` (blocking); None if its lock file cannot be opened (a read-only
        cache): then two processes may both run the action, both correctly."""
        prefix = key[:3]
        with self._cond:
            while True:
                entry = self._held.get(prefix)
                if entry is None:
                    entry = self._held[prefix] = _Prefix()
                    break  # this thread takes the file lock, outside the condition
                if entry.fd is None or key in entry.keys:
                    self._cond.wait()  # being taken, or this very key is held
                    continue
                entry.keys.add(key)
                return KeyLock(self, key)
        fd = None
        try:
            fd = flock_fd(self.folder / prefix, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                          wait=True)
        finally:
            with self._cond:
                if fd is None:
                    del self._held[prefix]
                else:
                    entry.fd = fd
                    entry.keys.add(key)
                self._cond.notify_all()
        return KeyLock(self, key) if fd is not None else None

    def _release(self, key: str) -> None:
        prefix = key[:3]
        with self._cond:
            entry = self._held[prefix]
            entry.keys.discard(key)
            if not entry.keys:
                del self._held[prefix]
                assert entry.fd is not None
                os.close(entry.fd)
            self._cond.notify_all()


def flock_fd(path: Path, flags: int, *, wait: bool) -> int | None:
    """An fd, opened with ``flags``, holding an exclusive ``flock`` on ``path``; None if
    it cannot be opened or (``wait=False``) someone else holds the lock. ``wait``: block
    until the lock is free (an error while waiting is raised)."""
    import fcntl

    while True:
        try:
            fd = os.open(path, flags, 0o644)  # (the mode only matters when O_CREAT makes it)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BaseException as exc:
            os.close(fd)
            if wait or not isinstance(exc, OSError):
                raise
            return None
        if not flags & os.O_CREAT or _still_named(fd, path):
            return fd
        # The file was deleted (``cache gc``, a sweep) between our open and our lock:
        # a lock on it excludes no one who opens the name now. Take the one there.
        os.close(fd)


def _still_named(fd: int, path: Path) -> bool:
    """Is the file open as ``fd`` still the one at ``path``?"""
    try:
        named = os.stat(path)
    except OSError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)
