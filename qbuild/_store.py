"""The local content-addressed store and action cache, on diskcache.

Layout under the cache directory::

    cas/    digest -> blob, always kept as a file by diskcache (streamed, never whole
            in memory); blobs are read-only and only ever copied out, never linked
    ac/     action key -> JSON action result (output digests, info, warnings);
            "components:<key>" -> the key's parts, for ``qbuild explain``;
            "code:<digest>" -> a code unit's per-file digests (to name a changed file);
            "code:<digest>" -> a code unit's per-file digests (to name a changed file)
    memo/   stat key -> digest of a source file; "verified:<digest>" -> the blob's stat
            when it last matched its digest
    tmp/    sandboxes of running actions (safe to delete when no build runs)

This is the only module that imports diskcache. ``Store`` is the narrow interface the
executor and the build use, so a remote cache (Bazel's HTTP protocol: ``/ac/<sha256>``,
``/cas/<sha256>``) can sit behind the same methods.
"""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path
from typing import Any, Protocol

import diskcache

from ._digest import clone_or_copy, copy_hashing, stat_key

_SETTINGS = {
    "eviction_policy": "none",  # never evict behind our back; `qbuild cache gc` does it
    "size_limit": 2**62,
    "statistics": 0,
    "tag_index": 0,
}


_MODE_R = stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH
_MODE_X = _MODE_R | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH


class _Adopt:
    """A file handed to the store to be renamed into place rather than copied."""

    def __init__(self, path: Path) -> None:
        self.path = path


class _AdoptingDisk(diskcache.Disk):
    """diskcache's file storage, plus adoption: a blob written in the cache's own tmp/
    (an action's sandbox) is moved in, so storing an output costs no second copy."""

    def store(self, value: Any, read: bool, key: Any = diskcache.core.UNKNOWN) -> Any:
        if isinstance(value, _Adopt):
            filename, full_path = self.filename(key, value)
            try:
                os.makedirs(os.path.dirname(full_path), exist_ok=True)
                os.rename(value.path, full_path)
                return os.path.getsize(full_path), diskcache.core.MODE_BINARY, filename, None
            except OSError:
                with open(value.path, "rb") as handle:  # another filesystem: copy
                    return super().store(handle, read, key=key)
        return super().store(value, read, key=key)


class Store(Protocol):
    """What the build needs from a cache: action results and verified blobs."""

    def get_action(self, key: str) -> dict[str, Any] | None: ...
    def put_action(self, key: str, result: dict[str, Any]) -> None: ...
    def has_blob(self, digest: str) -> bool: ...
    def put_blob(self, path: Path, digest: str, adopt: bool = False) -> None: ...
    def restore_blob(self, digest: str, dest: Path, executable: bool = False) -> bool: ...
    def memo_get(self, key: str) -> str | None: ...
    def memo_put(self, key: str, digest: str) -> None: ...


class LocalStore:
    """A ``Store`` in a local directory, safe for concurrent processes."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.tmp = directory / "tmp"
        self.tmp.mkdir(exist_ok=True)
        self._ac = diskcache.Cache(str(directory / "ac"), **_SETTINGS)
        self._cas = diskcache.Cache(str(directory / "cas"), disk=_AdoptingDisk, **_SETTINGS)
        self._memo = diskcache.Cache(str(directory / "memo"), **_SETTINGS)

    def close(self) -> None:
        for cache in (self._ac, self._cas, self._memo):
            cache.close()

    # -- action cache -----------------------------------------------------------------
    def get_action(self, key: str) -> dict[str, Any] | None:
        raw = self._ac.get(key)
        return json.loads(raw) if raw is not None else None

    def put_action(self, key: str, result: dict[str, Any]) -> None:
        self._ac.set(key, json.dumps(result, sort_keys=True))

    def drop_action(self, key: str) -> None:
        self._ac.delete(key)

    def get_components(self, key: str) -> dict[str, Any] | None:
        raw = self._ac.get("components:" + key)
        return json.loads(raw) if raw is not None else None

    def put_components(self, key: str, components: dict[str, Any]) -> None:
        self._ac.set("components:" + key, json.dumps(components, sort_keys=True))

    def get_code(self, digest: str) -> dict[str, str] | None:
        raw = self._ac.get("code:" + digest)
        return json.loads(raw) if raw is not None else None

    def put_code(self, digest: str, files: dict[str, str]) -> None:
        if "code:" + digest not in self._ac:
            self._ac.set("code:" + digest, json.dumps(files, sort_keys=True))

    # -- blobs --------------------------------------------------------------------------
    def has_blob(self, digest: str) -> bool:
        return digest in self._cas

    def _blob_path(self, digest: str) -> Path | None:
        handle = self._cas.get(digest, read=True)
        if handle is None:
            return None
        handle.close()
        return Path(handle.name)

    def put_blob(self, path: Path, digest: str, adopt: bool = False) -> None:
        """Store the file at ``path`` (already hashed to ``digest``) if it is new.

        ``adopt``: the file is the caller's to give away (an action's output in its
        sandbox, on the cache's filesystem): it is renamed into the store, not copied.
        """
        if digest in self._cas:
            return
        if adopt:
            self._cas.set(digest, _Adopt(path), read=True)
        else:
            with open(path, "rb") as handle:
                self._cas.set(digest, handle, read=True)
        stored = self._blob_path(digest)
        if stored is not None:
            os.chmod(stored, stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)

    def restore_blob(self, digest: str, dest: Path, executable: bool = False) -> bool:
        """Place a verified private copy of the blob at ``dest`` (read-only; executable
        if asked); False if the blob is missing or corrupt (it is then deleted).

        Never a link: whoever can write to ``dest`` (a rule, a user, root) cannot reach
        the blob. A blob is hashed while it is copied unless this store verified it
        before and its (inode, ctime, size, mtime) are unchanged since: any write to it
        moves its ctime.
        """
        source = self._blob_path(digest)
        try:
            st = os.stat(source) if source is not None else None
        except OSError:
            st = None
        if source is None or st is None:
            self._cas.delete(digest)
            return False
        verified_key = "verified:" + digest
        trusted = self._memo.get(verified_key) == stat_key(st)
        dest.parent.mkdir(parents=True, exist_ok=True)
        temp = dest.with_name(f".{dest.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            temp.unlink(missing_ok=True)
            if trusted:
                clone_or_copy(source, temp)
            elif copy_hashing(source, temp) != digest or stat_key(os.stat(source)) != \
                    stat_key(st):
                self._cas.delete(digest)
                self._memo.delete(verified_key)
                return False
            else:
                self._memo.set(verified_key, stat_key(st))
            os.chmod(temp, _MODE_X if executable else _MODE_R)
            os.replace(temp, dest)
        finally:
            temp.unlink(missing_ok=True)
        return True

    # -- stat memo ----------------------------------------------------------------------
    def memo_get(self, key: str) -> str | None:
        return self._memo.get(key)

    def memo_put(self, key: str, digest: str) -> None:
        self._memo.set(key, digest)

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

    def gc(self, max_bytes: int) -> dict[str, int]:
        """Evict the least recently stored blobs until the store holds at most
        ``max_bytes``. Action results pointing at evicted blobs rebuild when needed."""
        before = self._cas.volume()
        self._cas.reset("eviction_policy", "least-recently-stored")
        self._cas.reset("size_limit", max(0, max_bytes))
        removed = self._cas.cull()
        self._cas.reset("eviction_policy", "none")
        self._cas.reset("size_limit", _SETTINGS["size_limit"])
        self._memo.clear()  # cheap to rebuild; keeps the memo from growing forever
        return {"before": before, "after": self._cas.volume(), "removed": removed}
