"""The local content-addressed store and action cache, on diskcache.

Layout under the cache directory::

    cas/    digest -> blob, always kept as a file by diskcache (streamed, never whole
            in memory); blobs are read-only and copied (or cloned) out, or hard-linked
            into the sandbox of an action that declared ``link_inputs`` (``_linked``:
            an edit of such a link is detected after the action, the blob discarded)
    ac/     action key -> JSON action result (output digests, info, warnings);
            "components:<key>" -> the key's parts, for ``qbuild explain``;
            "code:<digest>" -> a code unit's per-file digests (to name a changed file)
    memo/   stat key -> digest of a source file; "verified:<digest>" -> the blob's stat
            when it last matched its digest
    tmp/    sandboxes of running actions (each holds a lock on its folder while in use)
    locks/  4,096 lock files, one per first three hex digits of an action key, so two
            processes never run the same action at once: the second waits and takes
            the first's result

Durability: a blob file is made read-only and fsync'ed (with its directory) before its
index row commits, or, in a build (``defer_sync``), fsync'ed together with the other
blobs stored since, before the next action entry commits (an output adopted in a build
is moved into ``cas/`` at once and its index row written with that batch, after the
fsyncs; until then this process finds it in memory); an action entry is written only
after all its blobs are stored. So after a power loss an action entry that
survived points at blobs that survived (a blob row whose file did not survive is
found by the digest check on its next use, dropped and rebuilt).

Damage is never a crash: a damaged SQLite index is moved aside and rebuilt empty (one
message), entries of the wrong shape are misses, a blob that does not match its digest
is deleted and rebuilt, and errors reading the store are misses. Errors writing it
(full disk, read-only cache) become one-line ``CacheError``s.

This is the only module that imports diskcache (or touches its internals). ``LocalStore``
implements the ``core.protocols.Store`` interface the executor and the build are typed
against, so a remote cache (Bazel's HTTP protocol: ``/ac/<sha256>``, ``/cas/<sha256>``)
can sit behind the same methods.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sqlite3
import stat
import sys
import threading
import time
from collections.abc import Callable
from json.scanner import make_scanner
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import diskcache

from ..core.errors import CacheError
from ..core.files import (
    copy_hashing,
    copy_new,
    has_reflinks,
    hash_file,
    stat_key,
    temp_name,
)
from ..core.records import ActionResult, KeyParts
from .gate import Refused, check_result, describe
from .keylock import KeyLock, KeyLocks

_SETTINGS = {
    "eviction_policy": "none",  # never evict behind our back; `qbuild cache gc` does it
    "size_limit": 2**62,
    "statistics": 0,
    "tag_index": 0,
}
_READ_ONLY = stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH
_DIGEST = re.compile(r"^[0-9a-f]{64}$")
_MEMO_BATCH = 256  # source digests remembered per memo transaction
_ORPHAN_AGE = 600.0  # seconds: a blob file this old with no index row is an orphan
T = TypeVar("T")


_MODE_R = stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH
_MODE_X = _MODE_R | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH


class _Adopt:
    """A file handed to the store to be renamed into place rather than copied."""

    def __init__(self, path: Path) -> None:
        self.path = path


class _InPlace:
    """A blob file already moved to its place under ``cas/`` (``filename`` relative to
    it): its index row is written later, with others (``LocalStore.make_durable``)."""

    __slots__ = ("filename", "size")

    def __init__(self, filename: str, size: int) -> None:
        self.filename = filename
        self.size = size


class _AdoptingDisk(diskcache.Disk):  # type: ignore[misc]
    """diskcache's file storage, plus adoption: a blob written in the cache's own tmp/
    (an action's sandbox) is moved in, so storing an output costs no second copy."""

    def filename(self, key: Any = diskcache.core.UNKNOWN,
                 value: Any = diskcache.core.UNKNOWN) -> tuple[str, str]:
        # One level of 256 folders instead of diskcache's two levels of 65,536: a new
        # blob almost never needs a new folder, and blobs made durable together share
        # few folders to fsync. (Files of the old layout are read where they are.)
        hex_name = os.urandom(16).hex()
        filename = os.path.join(hex_name[:2], hex_name[2:] + ".val")
        return filename, os.path.join(self._directory, filename)

    def store(self, value: Any, read: bool, key: Any = diskcache.core.UNKNOWN) -> Any:
        if isinstance(value, _InPlace):
            return value.size, diskcache.core.MODE_BINARY, value.filename, None
        if isinstance(value, _Adopt):
            filename, full_path = self.filename(key, value)
            try:
                try:
                    os.rename(value.path, full_path)
                except FileNotFoundError:
                    if not os.path.exists(value.path):
                        raise
                    os.makedirs(os.path.dirname(full_path), exist_ok=True)
                    self.new_folder(os.path.dirname(full_path))
                    os.rename(value.path, full_path)
                return os.path.getsize(full_path), diskcache.core.MODE_BINARY, filename, None
            except OSError:
                with open(value.path, "rb") as handle:  # another filesystem: copy
                    return super().store(handle, read, key=key)
        return super().store(value, read, key=key)

    def new_folder(self, path: str) -> None:
        """``path`` was just made to hold a blob."""


class _DurableDisk(_AdoptingDisk):
    """Blob files (copied or adopted) are read-only, and on disk before diskcache commits
    their row, unless the store defers that (``LocalStore.defer_sync``): then they are
    listed in ``pending`` and made durable before any action entry commits. The path and
    stat of the last file each thread stored are kept in ``stored`` (no lookup needed)."""

    pending: list[str] | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stored = threading.local()

    def new_folder(self, path: str) -> None:
        # Its entry in cas/ must be on disk too before an entry relies on a blob in it.
        if self.pending is not None:
            self.pending.append(path)  # made durable with its parent, like a blob file
        else:
            _fsync(os.path.dirname(path))

    def store(self, value: Any, read: bool, key: Any = diskcache.core.UNKNOWN) -> Any:
        size, mode, filename, db_value = super().store(value, read, key=key)
        if filename and not isinstance(value, _InPlace):  # (in place: durable already)
            full = os.path.join(self._directory, filename)
            st = os.stat(full)
            if stat.S_IMODE(st.st_mode) & ~_READ_ONLY:
                os.chmod(full, _READ_ONLY)
                st = os.stat(full)
            self.stored.last = (full, st)
            if self.pending is not None:
                self.pending.append(full)
            else:
                _fsync(full)
                _fsync(os.path.dirname(full))
        return size, mode, filename, db_value


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems cannot fsync directories
    finally:
        os.close(fd)


def _misshapen(path: Path) -> bool:
    """Is the index folder ``path`` damaged in its shape: not a folder, or its database
    file something else than a file (a folder, a link)? SQLite only says it cannot open
    it, as it does for a missing permission, which is not repaired but reported."""
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            return True
        return not stat.S_ISREG(os.lstat(path / "cache.db").st_mode)
    except FileNotFoundError:
        return False
    except OSError:
        return False


_scan = make_scanner(json.JSONDecoder())  # type: ignore[arg-type]  # (typeshed: a context)


def _parse(raw: Any) -> Any:
    """``json.loads(raw)``, for the text this store wrote (an entry per target and
    build) straight through the decoder's scanner: one call instead of three."""
    if type(raw) is str:
        try:
            value, end = _scan(raw, 0)
        except StopIteration:  # not JSON, or space first: as json.loads says
            return json.loads(raw)
        if end == len(raw):
            return value
    return json.loads(raw)


def _is_damage(exc: sqlite3.DatabaseError) -> bool:
    text = str(exc).lower()
    return any(word in text for word in ("malformed", "not a database", "corrupt",
                                         "no such table", "no such column"))


# Keys per "IN (...)" query: as many as SQLite takes (32,766 variables since 3.32, 999
# before); fewer, larger queries cost less than many small ones.
_IN_CHUNK = 5000 if sqlite3.sqlite_version_info >= (3, 32) else 500


class LocalStore:
    """A ``Store`` in a local directory, safe for concurrent processes."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        try:
            directory.mkdir(parents=True, exist_ok=True)
            self.tmp = directory / "tmp"
            self.tmp.mkdir(exist_ok=True)
            self.locks = directory / "locks"
            self.locks.mkdir(exist_ok=True)
            self._key_locks = KeyLocks(self.locks)
        except OSError as exc:
            raise CacheError(f"cannot use the cache directory {directory}: "
                             f"{exc.strerror or exc} (set cache_dir in qbuild.toml or "
                             "QBUILD_CACHE_DIR)") from None
        # digest -> stat keys its blob file had when this process last knew it intact:
        # stored from a file it hashed itself, verified, or linked/unlinked by this
        # process (a link or unlink moves the inode's ctime, a write its mtime)
        self._trusted: dict[str, set[str]] = {}
        self._trusted_lock = threading.Lock()
        self._code_saved: set[str] = set()
        self._pending: list[str] | None = None  # blob files not yet fsync'ed
        # Blobs adopted in a build whose index rows are not written yet (digest -> file
        # in cas/): ``make_durable`` writes them, after their files are on disk, in one
        # transaction; until then this process finds them here.
        self._fresh: dict[str, _InPlace] = {}
        self._memo_unsaved: dict[str, str] = {}  # stat key -> digest (see memo_put)
        self._memo_lock = threading.Lock()
        self._prefetched: dict[str, str] = {}  # action entries read ahead (by key)
        self._sync_lock = threading.Lock()
        self._ac = self._open("ac")
        self._cas = self._open("cas")
        self._memo = self._open("memo")

    # -- opening, damage and errors ----------------------------------------------------
    def _open(self, name: str) -> diskcache.Cache:
        path = self.directory / name
        kwargs: dict[str, Any] = dict(_SETTINGS)
        if name == "cas":
            kwargs["disk"] = _DurableDisk
        try:
            cache = diskcache.Cache(str(path), **kwargs)
            if name == "cas":
                cache.disk.pending = self._pending
            return cache
        except sqlite3.DatabaseError as exc:
            if not _is_damage(exc) and not _misshapen(path):
                raise CacheError(f"cannot open the cache index {path}: {exc}") from None
        except OSError as exc:
            if not _misshapen(path):
                raise CacheError(f"cannot open the cache index {path}: "
                                 f"{exc.strerror or exc}") from None
        self._set_aside(path)
        try:
            cache = diskcache.Cache(str(path), **kwargs)
            if name == "cas":
                cache.disk.pending = self._pending
            return cache
        except (sqlite3.DatabaseError, OSError) as exc:
            raise CacheError(f"cannot rebuild the cache index {path}: {exc}") from None

    def _set_aside(self, path: Path) -> None:
        aside = path.with_name(f"{path.name}.damaged-{os.getpid()}-{time.time_ns()}")
        try:
            os.replace(path, aside)
        except OSError:
            pass
        if aside.is_dir() and not aside.is_symlink():
            shutil.rmtree(aside, ignore_errors=True)
        else:
            aside.unlink(missing_ok=True)
        print(f"qbuild: the cache index {path} was damaged; rebuilt it empty (what it held "
              "will be rebuilt when needed)", file=sys.stderr)

    def _repair(self, name: str) -> None:
        cache = getattr(self, f"_{name}")
        with contextlib.suppress(Exception):
            cache.close()
        self._set_aside(self.directory / name)
        setattr(self, f"_{name}", self._open(name))

    def _read(self, name: str, op: Callable[[diskcache.Cache], T], default: T) -> T:
        """A read: any failure is a miss (and a damaged index is rebuilt)."""
        try:
            return op(getattr(self, f"_{name}"))
        except sqlite3.DatabaseError as exc:
            if _is_damage(exc):
                self._repair(name)
            return default
        except (diskcache.Timeout, OSError, ValueError, TypeError):
            return default

    def _write(self, name: str, op: Callable[[diskcache.Cache], T]) -> T:
        """A write: a damaged index is rebuilt and the write tried again; anything
        else that stops it is a one-line CacheError."""
        for attempt in range(2):
            try:
                return op(getattr(self, f"_{name}"))
            except sqlite3.DatabaseError as exc:
                if _is_damage(exc) and attempt == 0:
                    self._repair(name)
                    continue
                raise CacheError(f"cannot write to the cache {self.directory / name}: "
                                 f"{exc}") from None
            except diskcache.Timeout:
                raise CacheError(f"the cache {self.directory / name} stayed locked by "
                                 "another process; try again") from None
            except OSError as exc:
                raise CacheError(f"cannot write to the cache {self.directory / name}: "
                                 f"{exc.strerror or exc}") from None
        raise AssertionError("unreachable")

    # -- durability ---------------------------------------------------------------------
    def defer_sync(self) -> bool:
        """Stop fsync'ing each blob as it is stored: blobs are made durable together,
        by ``make_durable``, which every action-entry write calls first (so an entry
        never commits before the blobs stored so far are on disk). Always True: this
        store takes entries in batches (``put_results``)."""
        with self._sync_lock:
            if self._pending is None:
                self._pending = []
                self._cas.disk.pending = self._pending
        return True

    def make_durable(self) -> None:
        """fsync every blob stored since the last call, and each folder holding one;
        then write the index rows of the blobs adopted meanwhile (``_fresh``)."""
        with self._sync_lock:
            # Rows first: a row listed now had its file listed before it (put_blob), so
            # no row is written for a file that was not fsync'ed.
            rows = list(self._fresh.items())
            pending = self._pending
            files = list(pending) if pending else []
            if files:
                assert pending is not None
                del pending[:len(files)]
            for path in [*files, *dict.fromkeys(os.path.dirname(f) for f in files)]:
                try:
                    _fsync(path)
                except FileNotFoundError:
                    pass  # replaced since (its replacement is listed too) or dropped
            if rows:
                self._write_rows(rows)

    def _write_rows(self, rows: list[tuple[str, _InPlace]]) -> None:
        def write(cache: diskcache.Cache) -> None:
            with cache.transact():
                for digest, placed in rows:
                    if self._fresh.get(digest) is placed:  # (not dropped meanwhile)
                        cache.set(digest, placed, read=True)

        self._write("cas", write)
        for digest, placed in rows:
            if self._fresh.get(digest) is placed:
                del self._fresh[digest]

    def _drop_blob(self, digest: str) -> None:
        """Drop the blob of ``digest`` from the index (its row written or not)."""
        placed = self._fresh.pop(digest, None)
        if placed is not None:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.directory, "cas", placed.filename))
        self._read("cas", lambda c: c.delete(digest), False)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.make_durable()
        self._save_memo()
        for cache in (self._ac, self._cas, self._memo):
            with contextlib.suppress(Exception):
                cache.close()

    # -- action cache -----------------------------------------------------------------
    def find_action(self, key: str, record: bool = True
                    ) -> tuple[ActionResult | None, Literal["local", "remote"]]:
        """(result, "local"): the local store has no other origin."""
        return self.get_action(key), "local"

    def prefetch_actions(self, keys: list[str]) -> None:
        """Read the entries of ``keys`` now, in a few queries: the build is about to
        look each of them up (each is used once, and dropped when written)."""
        self._prefetched.update(self.action_texts(keys))

    def get_action(self, key: str) -> ActionResult | None:
        raw = self._prefetched.pop(key, None)
        if raw is None:
            raw = self._read("ac", lambda c: c.get(key), None)
        try:
            result = _parse(raw) if raw is not None else None
        except (TypeError, ValueError):
            result = None
        if result is None:
            return None
        try:
            found = check_result(result, None)  # (``check_entry``, without its call)
        except Refused as refused:
            # Written by something else (an older version, another user of a shared
            # cache folder): a miss, and dropped so it is rebuilt.
            print(f"qbuild: warning: {describe(key, refused)}; dropped it (rebuilt when "
                  "needed)", file=sys.stderr)
        else:
            # The entry's text, for a record of this result (``_incremental``) without
            # encoding it again: what ``put_action`` wrote for it.
            found.__dict__["_text"] = raw
            return found
        self.drop_action(key)
        return None

    def action_texts(self, keys: list[str]) -> dict[str, str]:
        """The stored text of each action entry of ``keys`` held in the index itself,
        in a few queries instead of one lookup per key (entries kept in files, and any
        read error, are left out: the caller looks them up one by one)."""
        def select(cache: diskcache.Cache) -> dict[str, str]:
            found: dict[str, str] = {}
            for start in range(0, len(keys), _IN_CHUNK):
                chunk = keys[start:start + _IN_CHUNK]
                rows = cache._sql(
                    "SELECT key, mode, value FROM Cache WHERE raw = 1 AND key IN "
                    f"({','.join('?' * len(chunk))})", chunk).fetchall()
                found.update((key, value) for key, mode, value in rows
                             if mode == diskcache.core.MODE_RAW and isinstance(value, str))
            return found

        return self._read("ac", select, {})

    def put_action(self, key: str, result: ActionResult) -> None:
        text = json.dumps(result.to_json(), sort_keys=True)
        self._durable()
        self._prefetched.pop(key, None)
        self._write("ac", lambda c: c.set(key, text))

    def _durable(self) -> None:
        try:
            self.make_durable()
        except OSError as exc:
            raise CacheError(f"cannot write to the cache {self.directory / 'cas'}: "
                             f"{exc.strerror or exc}") from None

    def put_results(self, items: list[tuple[str, KeyParts, ActionResult]]) -> None:
        """Several keys' parts and results, in one transaction, after their blobs (and
        every other blob stored so far) are durable."""
        texts = [(key, json.dumps(parts, sort_keys=True),
                  json.dumps(result.to_json(), sort_keys=True))
                 for key, parts, result in items]
        self._durable()
        for key, _parts, _result in items:
            self._prefetched.pop(key, None)

        def write(cache: diskcache.Cache) -> None:
            with cache.transact():
                for key, parts_text, result_text in texts:
                    cache.set("components:" + key, parts_text)
                    cache.set(key, result_text)

        self._write("ac", write)

    def drop_action(self, key: str) -> None:
        self._prefetched.pop(key, None)
        with contextlib.suppress(CacheError):
            self._write("ac", lambda c: c.delete(key))

    def get_components(self, key: str) -> KeyParts | None:
        raw = self._read("ac", lambda c: c.get("components:" + key), None)
        try:
            value = json.loads(raw) if raw is not None else None
        except (TypeError, ValueError):
            return None
        return value if isinstance(value, dict) else None

    def put_result(self, key: str, components: KeyParts, result: ActionResult) -> None:
        """The key's parts and its action result, in one transaction."""
        parts_text = json.dumps(components, sort_keys=True)
        result_text = json.dumps(result.to_json(), sort_keys=True)
        self._durable()
        self._prefetched.pop(key, None)

        def write(cache: diskcache.Cache) -> None:
            with cache.transact():
                cache.set("components:" + key, parts_text)
                cache.set(key, result_text)

        self._write("ac", write)

    def put_components(self, key: str, components: KeyParts) -> None:
        self._write("ac", lambda c: c.set("components:" + key,
                                          json.dumps(components, sort_keys=True)))

    def lock_action(self, key: str) -> KeyLock | None:
        """Take the lock of one action key (blocking) across processes (``_keylock``);
        ``release()`` the returned lock. None: no lock possible (read-only cache): two
        processes may both run the action, both correctly."""
        return self._key_locks.acquire(key)

    def get_code(self, digest: str) -> dict[str, str] | None:
        raw = self._ac.get("code:" + digest)
        return json.loads(raw) if raw is not None else None

    def put_code(self, digest: str, files: dict[str, str]) -> None:
        if digest in self._code_saved:
            return
        if "code:" + digest not in self._ac:
            self._ac.set("code:" + digest, json.dumps(files, sort_keys=True))
        self._code_saved.add(digest)

    # -- blobs --------------------------------------------------------------------------
    @property
    def remote_usable(self) -> bool:
        """False: this store has no remote to download a blob from."""
        return False

    def has_blob(self, digest: str) -> bool:
        return digest in self._fresh or self._read("cas", lambda c: digest in c, False)

    def blob_digests(self) -> list[str]:
        """The digest of every blob whose index row is written (for checks and tests:
        one pass over the index)."""
        return [str(key) for key in self._cas.iterkeys()]

    def _blob_path(self, digest: str) -> Path | None:
        """The blob file of ``digest``, if the index has it and the file exists."""
        path = self._blob_row(digest)
        return path if path is not None and os.path.exists(path) else None

    def _blob_row(self, digest: str) -> Path | None:
        """Where the index says the blob of ``digest`` is (one query; the file is not
        opened: callers stat it and treat a missing file as a missing blob)."""
        fresh = self._fresh.get(digest)
        if fresh is not None:
            return Path(self.directory, "cas", fresh.filename)

        def find(cache: diskcache.Cache) -> Path | None:
            row = cache._sql("SELECT filename FROM Cache WHERE key = ? AND raw = 1",
                             (digest,)).fetchone()
            return Path(self.directory, "cas", row[0]) if row and row[0] else None

        return self._read("cas", find, None)

    def _memo_set(self, key: str, value: Any) -> None:
        """Remember ``value`` in the memo; failing to is only a later re-verification."""
        self._read("memo", lambda c: c.set(key, value), None)

    def _intact(self, path: Path, digest: str) -> bool:
        try:
            st = os.stat(path)
            if st.st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH):
                os.chmod(path, _READ_ONLY)  # left writable by an older version
            return hash_file(path) == digest
        except OSError:
            return False

    def put_blob(self, path: Path, digest: str, adopt: bool = False,
                 hashed: os.stat_result | None = None) -> bool:
        """Store the file at ``path`` (already hashed to ``digest``); a stored copy that
        is missing or damaged is replaced. False if an intact copy was stored already
        (an adopted file is then still the caller's).

        ``adopt``: the file is the caller's to give away (an action's output in its
        sandbox, on the cache's filesystem): it is renamed into the store, not copied.
        ``hashed``: its stat when it was hashed; if the adopted blob still has that
        inode, size and mtime, this process trusts it without hashing it again.
        """
        stored = self._blob_row(digest)
        if stored is not None:
            if self._verified(stored, digest) or self._intact(stored, digest):
                return False
            self._distrust(digest)
            self._drop_blob(digest)
        if adopt and self._pending is not None:
            placed = self._adopt_deferred(path, digest, hashed)
            if placed:
                return True
        if adopt:
            self._cas.disk.stored.last = None
            self._write("cas", lambda c: c.set(digest, _Adopt(path), read=True))
            if hashed is not None:
                self._trust_adopted(digest, hashed)
            return True  # (or copied in from another filesystem: the file is left)
        with open(path, "rb") as handle:
            self._write("cas", lambda c: c.set(digest, handle, read=True))
        return False

    def _adopt_deferred(self, path: Path, digest: str, hashed: os.stat_result | None
                        ) -> bool:
        """In a build (``defer_sync``): move ``path`` into ``cas/`` now and leave its
        index row to ``make_durable`` (one transaction for many, off the action's path).
        False if it cannot be moved (another filesystem): the caller stores it."""
        disk = self._cas.disk
        filename, full = disk.filename()
        try:
            try:
                os.rename(path, full)
            except FileNotFoundError:
                if not os.path.exists(path):
                    raise
                os.makedirs(os.path.dirname(full), exist_ok=True)
                disk.new_folder(os.path.dirname(full))
                os.rename(path, full)
        except FileNotFoundError:
            raise
        except OSError:
            return False
        st = os.stat(full)
        if stat.S_IMODE(st.st_mode) & ~_READ_ONLY:
            os.chmod(full, _READ_ONLY)
            st = os.stat(full)
        assert self._pending is not None
        self._pending.append(full)
        self._fresh[digest] = _InPlace(filename, st.st_size)
        # Renaming and chmod move the ctime; a write since the hash moves the mtime.
        if hashed is not None and (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) == (
                hashed.st_dev, hashed.st_ino, hashed.st_size, hashed.st_mtime_ns):
            self.vouch(digest, st)
        return True

    def _trust_adopted(self, digest: str, hashed: os.stat_result) -> None:
        stored = getattr(self._cas.disk.stored, "last", None)
        if stored is None:
            return
        st = stored[1]
        # Renaming and chmod move the ctime; a write since the hash moves the mtime.
        if (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) == (
                hashed.st_dev, hashed.st_ino, hashed.st_size, hashed.st_mtime_ns):
            self.vouch(digest, st)

    def vouch(self, digest: str, st: os.stat_result) -> None:
        """Remember that the blob of ``digest`` is intact with stat ``st`` (this process
        hashed it, or saw it intact just before its own link or unlink moved its ctime)."""
        with self._trusted_lock:
            self._trusted.setdefault(digest, set()).add(stat_key(st))

    def _distrust(self, digest: str) -> None:
        with self._trusted_lock:
            self._trusted.pop(digest, None)

    def trusts(self, digest: str, st: os.stat_result) -> bool:
        """Is the blob file with stat ``st`` known intact (by this process, or verified
        by hashing with exactly this stat)? Any write moves the mtime and the ctime, a
        chmod or a restored mtime the ctime: none of those stats match then."""
        key = stat_key(st)
        if key in self._trusted.get(digest, ()):
            return True
        return bool(self._read("memo", lambda c: c.get("verified:" + digest), None) == key)

    def _verified(self, path: Path, digest: str) -> bool:
        """The blob matched its digest when last checked and has not been touched since."""
        try:
            st = os.stat(path)
        except OSError:
            return False
        return self.trusts(digest, st)

    def restore_blob(self, digest: str, dest: Path, executable: bool = False) -> bool:
        """Place a verified private copy of the blob at ``dest`` (read-only; executable
        if asked); False if the blob is missing or corrupt (it is then deleted).

        Never a link (``link_blob`` is the one way to a link, checked after use):
        whoever can write to ``dest`` (a rule, a user, root) cannot reach the blob. A
        blob is hashed while it is copied unless this store verified it before and its
        (inode, ctime, size, mtime) are unchanged since, before and after the copy: any
        write to it moves its ctime.
        """
        verified_key = "verified:" + digest
        hash_it = False
        for _attempt in range(3):  # a concurrent put may replace the file under us
            source = self._blob_row(digest)
            try:
                st = os.stat(source) if source is not None else None
            except OSError:
                st = None
            if source is None or st is None:
                self._drop_blob(digest)
                return False
            trusted = not hash_it and self.trusts(digest, st)
            temp = temp_name(dest)
            placed = False
            try:
                if not dest.parent.is_dir():
                    dest.parent.mkdir(parents=True, exist_ok=True)
                if trusted:
                    _before, after, _copied = copy_new(source, temp, executable)
                    if stat_key(after) != stat_key(st):
                        hash_it = True  # touched while copied: copy again, hashing
                        continue
                elif copy_hashing(source, temp) != digest or \
                        stat_key(os.stat(source)) != stat_key(st):
                    if self._blob_row(digest) != source:
                        continue  # replaced meanwhile: look again
                    self._drop_blob(digest)
                    self._read("memo", lambda c: c.delete(verified_key), False)
                    self._distrust(digest)
                    return False
                else:
                    self._memo_set(verified_key, stat_key(st))
                    os.chmod(temp, _MODE_X if executable else _MODE_R)
                os.replace(temp, dest)
                placed = True
            except FileExistsError:
                temp.unlink(missing_ok=True)  # left by a process that died (same pid)
                continue
            except FileNotFoundError:
                continue
            finally:
                if not placed:
                    temp.unlink(missing_ok=True)
            return True
        return False

    def link_blob(self, digest: str, dest: Path) -> tuple[Path, os.stat_result] | None:
        """Make ``dest`` a hard link to the verified, read-only blob of ``digest`` (no
        data read or written); returns the blob's path and the link's stat, or None
        (missing, unverifiable, or not linkable: the caller copies instead). The
        caller must check the link after use (``_linked``): it is the blob itself."""
        if has_reflinks(self.tmp):
            return None  # a clone is private and costs no I/O either
        source = self._blob_row(digest)
        try:
            if source is None:
                return None
            before = os.stat(source)
            if before.st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH):
                return None
            if not self.trusts(digest, before):
                if hash_file(source) != digest or \
                        stat_key(os.stat(source)) != stat_key(before):
                    return None  # restore_blob copies, hashing, and deletes it if bad
                self._memo_set("verified:" + digest, stat_key(before))
                self.vouch(digest, before)
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.link(source, dest)
            after = os.stat(dest)
        except OSError:
            return None
        if (after.st_ino, after.st_size, after.st_mtime_ns, after.st_mode) != (
                before.st_ino, before.st_size, before.st_mtime_ns, before.st_mode):
            dest.unlink(missing_ok=True)  # written between the check and the link
            return None
        self.vouch(digest, after)
        return source, after

    def discard_blob(self, digest: str, inode: tuple[int, int]) -> None:
        """Drop the blob of ``digest`` if its file is still ``inode`` (dev, ino): it was
        found modified, so no build may be served it again (its actions rerun)."""
        self._distrust(digest)
        self._read("memo", lambda c: c.delete("verified:" + digest), False)
        source = self._blob_row(digest)
        try:
            st = os.stat(source) if source is not None else None
        except OSError:
            st = None
        if st is not None and (st.st_dev, st.st_ino) == inode:
            self._drop_blob(digest)
            with contextlib.suppress(OSError):
                os.unlink(source)  # type: ignore[arg-type]  # if the row was already gone

    # -- stat memo ----------------------------------------------------------------------
    def memo_get(self, key: str) -> str | None:
        value = self._memo_unsaved.get(key)
        if value is None:
            value = self._read("memo", lambda c: c.get(key), None)
        return value if isinstance(value, str) and _DIGEST.match(value) else None

    def memo_put(self, key: str, digest: str) -> None:
        """Remember a source's digest by its stat key; written in batches (one
        transaction per ``_MEMO_BATCH``, the rest at ``close``): a cold build keys
        thousands of sources, and losing a few to a kill costs only hashing them again."""
        self._memo_unsaved[key] = digest
        if len(self._memo_unsaved) >= _MEMO_BATCH:
            self._save_memo()

    def _save_memo(self) -> None:
        with self._memo_lock:
            items = list(self._memo_unsaved.items())
            if not items:
                return

            def write(cache: diskcache.Cache) -> None:
                with cache.transact():
                    for key, digest in items:
                        cache.set(key, digest)

            with contextlib.suppress(CacheError):  # only an optimisation
                self._write("memo", write)
            for key, digest in items:
                if self._memo_unsaved.get(key) == digest:
                    del self._memo_unsaved[key]

    # -- maintenance ----------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        return {
            "directory": str(self.directory),
            "actions": sum(1 for k in self._ac.iterkeys()
                           if not str(k).startswith(("comp", "code:"))),
            "blobs": len(self._cas),
            "blob_bytes": self._cas.volume(),
            "action_cache_bytes": self._ac.volume(),
            "memo_entries": len(self._memo),
        }

    def volume(self) -> int:
        """Bytes the cache holds (blobs and action results), without walking any files."""
        return int(self._cas.volume() + self._ac.volume() + self._memo.volume())

    def gc(self, max_bytes: int) -> dict[str, int]:
        """Evict the least recently stored blobs until the store holds at most
        ``max_bytes``, and reclaim blob files no index row points at (left by a killed
        process). Action results pointing at evicted blobs rebuild when needed."""
        before = self._cas.volume()

        def cull(cache: diskcache.Cache) -> int:
            cache.reset("eviction_policy", "least-recently-stored")
            cache.reset("size_limit", max(0, max_bytes))
            try:
                return int(cache.cull())
            finally:
                cache.reset("eviction_policy", "none")
                cache.reset("size_limit", _SETTINGS["size_limit"])

        removed = self._write("cas", cull)
        orphans = self._reclaim_orphans()
        self._write("memo", lambda c: c.clear())  # cheap to rebuild; bounds its growth
        for lock in self.locks.iterdir():
            _unlink_if_unlocked(lock)
        return {"before": before, "after": self._cas.volume(), "removed": removed,
                "orphans": orphans}

    def _reclaim_orphans(self) -> int:
        def names(cache: diskcache.Cache) -> set[str]:
            rows = cache._sql("SELECT filename FROM Cache WHERE filename IS NOT NULL")
            return {row[0] for row in rows}

        known = self._write("cas", names)
        base = self.directory / "cas"
        now = time.time()
        count = 0
        for directory, _dirs, files in os.walk(base):
            for name in files:
                if not name.endswith(".val"):
                    continue
                path = os.path.join(directory, name)
                rel = os.path.relpath(path, base).replace(os.sep, "/")
                if rel in known:
                    continue
                try:
                    if now - os.stat(path).st_mtime < _ORPHAN_AGE:
                        continue  # may be a blob another process is storing right now
                    os.unlink(path)
                    count += 1
                except OSError:
                    pass
        return count


def _place(source: Path, dest: Path, link: bool) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    temp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    try:
        temp.unlink(missing_ok=True)
        if link:
            try:
                os.link(source, temp)
            except FileNotFoundError:
                raise
            except OSError:
                shutil.copyfile(source, temp)
                os.chmod(temp, _READ_ONLY)
        else:
            shutil.copyfile(source, temp)
        os.replace(temp, dest)
    finally:
        temp.unlink(missing_ok=True)


def _unlink_if_unlocked(path: Path) -> None:
    import fcntl

    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        path.unlink()
    except OSError:
        pass
    finally:
        os.close(fd)


if TYPE_CHECKING:
    from ..core.protocols import Store

    _A_STORE: type[Store] = LocalStore  # mypy proves it implements every member of Store
