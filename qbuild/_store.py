"""The local content-addressed store and action cache, on diskcache.

Layout under the cache directory::

    cas/    digest -> blob, always kept as a file by diskcache (streamed, never whole
            in memory); blobs are read-only and hard-linked out where possible
    ac/     action key -> JSON action result (output digests, info, warnings);
            "components:<key>" -> the key's parts, for ``qbuild explain``
    memo/   stat key -> digest of a source file
    tmp/    sandboxes of running actions (safe to delete when no build runs)

This is the only module that imports diskcache. ``Store`` is the narrow interface the
executor and the build use, so a remote cache (Bazel's HTTP protocol: ``/ac/<sha256>``,
``/cas/<sha256>``) can sit behind the same methods.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any, Protocol

import diskcache

from ._digest import hash_file

_SETTINGS = {
    "eviction_policy": "none",  # never evict behind our back; `qbuild cache gc` does it
    "size_limit": 2**62,
    "statistics": 0,
    "tag_index": 0,
}


class Store(Protocol):
    """What the build needs from a cache: action results and verified blobs."""

    def get_action(self, key: str) -> dict[str, Any] | None: ...
    def put_action(self, key: str, result: dict[str, Any]) -> None: ...
    def has_blob(self, digest: str) -> bool: ...
    def put_blob(self, path: Path, digest: str) -> None: ...
    def restore_blob(self, digest: str, dest: Path, link: bool = True) -> bool: ...
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
        self._cas = diskcache.Cache(str(directory / "cas"), **_SETTINGS)
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

    # -- blobs --------------------------------------------------------------------------
    def has_blob(self, digest: str) -> bool:
        return digest in self._cas

    def _blob_path(self, digest: str) -> Path | None:
        handle = self._cas.get(digest, read=True)
        if handle is None:
            return None
        handle.close()
        return Path(handle.name)

    def put_blob(self, path: Path, digest: str) -> None:
        """Store the file at ``path`` (already hashed to ``digest``) if it is new."""
        if digest in self._cas:
            return
        with open(path, "rb") as handle:
            self._cas.set(digest, handle, read=True)
        stored = self._blob_path(digest)
        if stored is not None:
            os.chmod(stored, stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)

    def restore_blob(self, digest: str, dest: Path, link: bool = True) -> bool:
        """Place the verified blob at ``dest`` (hard link, else copy); False if missing.

        A blob whose content no longer matches its digest is deleted, never served.
        """
        source = self._blob_path(digest)
        if source is None or not source.exists():
            self._cas.delete(digest)
            return False
        if hash_file(source) != digest:
            self._cas.delete(digest)
            return False
        dest.parent.mkdir(parents=True, exist_ok=True)
        temp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
        try:
            temp.unlink(missing_ok=True)
            if link:
                try:
                    os.link(source, temp)
                except OSError:
                    shutil.copyfile(source, temp)
                    os.chmod(temp, stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
            else:
                shutil.copyfile(source, temp)
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
            "actions": sum(1 for k in self._ac.iterkeys() if not str(k).startswith("comp")),
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
        ``max_bytes``. Action results pointing at evicted blobs rebuild when needed."""
        before = self._cas.volume()
        self._cas.reset("eviction_policy", "least-recently-stored")
        self._cas.reset("size_limit", max(0, max_bytes))
        removed = self._cas.cull()
        self._cas.reset("eviction_policy", "none")
        self._cas.reset("size_limit", _SETTINGS["size_limit"])
        self._memo.clear()  # cheap to rebuild; keeps the memo from growing forever
        return {"before": before, "after": self._cas.volume(), "removed": removed}
