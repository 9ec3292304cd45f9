"""Local cache first, then a shared remote one: the ``Store`` a build uses when a remote
cache is configured, and where its settings come from.

Owns: the remote-cache settings (``--remote_*`` flags, then the ``QBUILD_REMOTE_*``
environment, then ``[remote]`` in ``qbuild.toml``); the mapping between qbuild's action
results and REAPI ``ActionResult`` JSON; fetching action results lazily ("build without
the bytes": a remote hit records the result, and a blob is downloaded only when
``restore_blob`` is asked for it, i.e. when a dependent runs or the user requested the
target); uploading local results in background threads (every blob before the entry
that references it, so no entry ever points at a missing blob; each blob from a private
copy checked against its digest, ``send_blob``, so no damaged local file is ever sent).

Every entry read from the server passes ``gate.admit`` before anything uses it: bound to
the key it was fetched for (its uploaded key parts must hash to that key), paths inside
the output folder, sizes whole and bounded, executable bits kept (REAPI's
``isExecutable``); a refused entry is a miss with one warning per build and nothing of it
is recorded. Downloads are cut at the size the entry states and every request has one
deadline (``store.http``). The remote never fails a build: the first transport error
(after retries) or blob that does not match its digest gives one warning and the rest of
the build is local only. Nothing downloaded is used before its digest is verified.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ..core.errors import ConfigError, UsageError
from ..core.files import hash_bytes
from ..core.records import ActionResult, KeyParts
from ..core.toml import load_toml
from . import gate
from .http import DigestMismatch, HttpCache, RemoteConfig, RemoteError
from .keylock import KeyLock
from .local import LocalStore

RESULT_PATH = ".qbuild/result.json"  # the output file of an ActionResult holding our metadata
_FORMAT = 1
_KNOWN = {"cache", "upload_local_results", "timeout", "headers",
          "executor", "local_fallback", "strategy"}  # the last three: _dask_executor
_UPLOAD_THREADS = 4
_MAX_ENTRY_BYTES = 16 << 20  # an ActionResult lists paths and digests: a few KB each
MAX_META_BYTES = 16 << 20  # key parts, info and warnings: refused unread when larger


# -- settings ---------------------------------------------------------------------------------
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 token
_HEADER_VALUE = re.compile(r"[^\x00-\x08\x0a-\x1f\x7f]*")  # no control but tab


def _header_ok(name: str, value: str) -> bool:
    return bool(_HEADER_NAME.fullmatch(name)) and bool(_HEADER_VALUE.fullmatch(value))


def _truthy(text: str) -> bool | None:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    return None


def resolve_remote(root: Path, flags: Mapping[str, Any] | None = None,
                   environ: Mapping[str, str] | None = None) -> RemoteConfig | None:
    """The remote cache settings of a command, or None when no remote cache is set.

    ``flags`` holds ``cache``, ``upload``, ``timeout`` (None: not given) and ``headers``
    (a list of ``Name=Value``). An empty ``--remote_cache=`` turns a configured one off.
    """
    flags = dict(flags or {})
    environ = os.environ if environ is None else environ
    marker = root / "qbuild.toml"
    table = load_toml(marker).get("remote", {})
    if not isinstance(table, dict):
        raise ConfigError("[remote] must be a table", file=marker)
    unknown = sorted(set(table) - _KNOWN)
    if unknown:
        raise ConfigError(f"unknown [remote] setting(s) {', '.join(unknown)}; known: "
                          f"{', '.join(sorted(_KNOWN))}", file=marker)
    url = flags.get("cache")
    if url is None:
        url = environ.get("QBUILD_REMOTE_CACHE")
    if url is None:
        url = table.get("cache")
        if url is not None and not isinstance(url, str):
            raise ConfigError("[remote] 'cache' must be a URL string", file=marker)
    if not url:
        return None
    upload = flags.get("upload")
    if upload is None and environ.get("QBUILD_REMOTE_UPLOAD_LOCAL_RESULTS"):
        upload = _truthy(environ["QBUILD_REMOTE_UPLOAD_LOCAL_RESULTS"])
        if upload is None:
            raise UsageError("QBUILD_REMOTE_UPLOAD_LOCAL_RESULTS must be true or false")
    if upload is None:
        upload = table.get("upload_local_results", True)
        if not isinstance(upload, bool):
            raise ConfigError("[remote] 'upload_local_results' must be true or false",
                              file=marker)
    timeout = flags.get("timeout")
    if timeout is None:
        timeout = table.get("timeout", 60)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ConfigError("[remote] 'timeout' must be a positive number of seconds",
                              file=marker)
    elif timeout <= 0:
        raise UsageError("--remote_timeout must be a positive number of seconds")
    headers: dict[str, str] = {}
    table_headers = table.get("headers", {})
    if not isinstance(table_headers, dict) or not all(
            isinstance(v, str) for v in table_headers.values()):
        raise ConfigError("[remote] 'headers' must be a table of strings", file=marker)
    for name, value in table_headers.items():
        if not _header_ok(name, value):
            # The value may be a secret: name only the header (and only if it is sane).
            shown = f" {name[:40]!r}" if _HEADER_NAME.fullmatch(name) else ""
            raise ConfigError(f"[remote] headers: the header{shown} must be a token name "
                              "and a one-line value (no newline or other control "
                              "character)", file=marker)
        headers[name] = value
    for item in flags.get("headers") or []:
        name, sep, value = item.partition("=")
        if not sep or not _header_ok(name.strip(), value):
            shown = f" {name.strip()[:40]!r}" if _HEADER_NAME.fullmatch(name.strip()) else ""
            raise UsageError(f"--remote_header must be Name=Value with a one-line value (got "
                             f"a malformed header{shown})")
        headers[name.strip()] = value
    config = RemoteConfig(url=url, upload=upload, timeout=float(timeout), headers=headers,
                          environ=environ)
    try:
        HttpCache(config)
    except ValueError as exc:
        raise UsageError(f"bad remote cache URL: {exc}") from None
    return config


# -- ActionResult <-> qbuild result ------------------------------------------------------------
def _digest_json(digest: str, size: int) -> dict[str, str]:
    # Proto3 JSON writes int64 as a string.
    return {"hash": digest, "sizeBytes": str(size)}


def to_action_result(outputs: list[dict[str, Any]], meta_digest: str, meta_size: int
                     ) -> bytes:
    """REAPI ``ActionResult`` JSON listing the outputs (with their executable bit) and
    our metadata blob."""
    files = []
    for e in outputs:
        item: dict[str, Any] = {"path": e["path"], "digest": _digest_json(e["digest"], e["size"])}
        if e.get("x"):
            item["isExecutable"] = True
        files.append(item)
    files.append({"path": RESULT_PATH, "digest": _digest_json(meta_digest, meta_size)})
    return json.dumps({"outputFiles": files}, sort_keys=True).encode()


def _field(item: dict[str, Any], camel: str, snake: str, default: Any = None) -> Any:
    return item.get(camel, item.get(snake, default))


def parse_action_result(raw: bytes) -> tuple[list[dict[str, Any]], tuple[str, int]]:
    """The output entries (as ``OutputEntry.to_json`` writes them, unchecked: the gate
    checks them) and the metadata blob's (digest, size) of an ``ActionResult``; raises
    ``gate.Refused`` if it is not one qbuild wrote."""
    data = gate.load_json(raw, _MAX_ENTRY_BYTES)
    if not isinstance(data, dict):
        raise gate.Refused("not a JSON object")
    files = _field(data, "outputFiles", "output_files")
    if not isinstance(files, list):
        raise gate.Refused("no outputFiles")
    outputs: list[dict[str, Any]] = []
    meta: tuple[str, int] | None = None
    for item in files:
        digest = item.get("digest") if isinstance(item, dict) else None
        if not isinstance(item, dict) or not isinstance(digest, dict):
            raise gate.Refused("malformed output file")
        value = digest.get("hash")
        size = gate.size_of(_field(digest, "sizeBytes", "size_bytes", 0))
        if not isinstance(value, str) or not gate.is_digest(value):
            raise gate.Refused("malformed digest")
        executable = _field(item, "isExecutable", "is_executable", False)
        if item.get("path") == RESULT_PATH:
            meta = (value, size)
        else:
            outputs.append({"path": item.get("path"), "digest": value, "size": size,
                            "x": executable})
    if meta is None:
        raise gate.Refused("not written by qbuild (no metadata blob)")
    return outputs, meta


# -- the layered store ---------------------------------------------------------------------
class LayeredStore:
    """A ``Store``: the local cache, backed by a remote Bazel HTTP cache. Every member of
    ``Store`` is spelled out here (what the remote layer does not change is the local
    store's), so the type checker sees any it lacks."""

    def __init__(self, local: LocalStore, config: RemoteConfig) -> None:
        self.local = local
        self.directory = local.directory
        self.tmp = local.tmp
        self.remote_config = config
        self.remote = HttpCache(config)
        self.upload = config.upload
        self.warn: Callable[[str], None] = lambda text: print(text, file=sys.stderr)
        self.remote_hits = 0
        self.blobs_downloaded = 0
        self.uploads_done = 0
        self._disabled = False
        self.problem = ""
        self._lock = threading.Lock()
        self._sizes: dict[str, int] = {}
        self._bad_blobs: set[str] = set()  # served with wrong bytes: replace once we have them
        self.blobs_repaired = 0
        self.entries_refused = 0  # remote entries the gate kept out (each a miss)
        self.unbound_skipped = 0  # results not uploaded: their key parts are not recorded
        self._fetching: dict[str, threading.Lock] = {}
        self._pool: Any = None
        self._futures: list[Any] = []

    # -- failure policy -------------------------------------------------------------------
    @property
    def usable(self) -> bool:
        return not self._disabled

    @property
    def remote_usable(self) -> bool:
        """Blobs of remote results can be downloaded until the remote is given up on."""
        return self.usable

    def _give_up(self, why: str) -> None:
        with self._lock:
            if self._disabled:
                return
            self._disabled = True
            self.problem = why
        self.warn(f"WARNING: remote cache {self.remote.display_url}: {why}; continuing "
                  "with the local cache only for the rest of this build")

    # -- action cache -----------------------------------------------------------------------
    def get_action(self, key: str) -> ActionResult | None:
        return self.find_action(key)[0]

    def prefetch_actions(self, keys: list[str]) -> None:
        self.local.prefetch_actions(keys)  # (remote entries are fetched one by one)

    def action_texts(self, keys: list[str]) -> dict[str, str]:
        return self.local.action_texts(keys)

    def find_action(self, key: str, record: bool = True
                    ) -> tuple[ActionResult | None, Literal["local", "remote"]]:
        """(result, "local" | "remote"); a remote hit is recorded locally unless
        ``record`` is False (``qbuild explain`` only looks)."""
        result = self.local.get_action(key)
        if result is not None:
            self._note_sizes(result)
            return result, "local"
        if not self.usable:
            return None, "local"
        found = self._remote_action(key)
        if found is None:
            return None, "local"
        result, components = found
        if record:
            self.local.put_components(key, components)
            self.local.put_action(key, result)
        with self._lock:
            self.remote_hits += 1
        return result, "remote"

    def _note_sizes(self, result: ActionResult) -> None:
        """Remember each output's size as its entry states it: a download of the blob
        is cut there (``_download``), whichever build recorded the entry."""
        with self._lock:
            for entry in result.outputs:
                self._sizes[entry.digest] = entry.size

    def _refused(self, key: str, refused: gate.Refused) -> None:
        """A miss: warn about the first refused entry of the build, count the rest."""
        with self._lock:
            self.entries_refused += 1
            first = self.entries_refused == 1
        if first:
            self.warn(f"WARNING: remote cache {self.remote.display_url}: "
                      f"{gate.describe(key, refused)}; it is a miss (other refused entries "
                      "are counted in the summary, not reported)")

    def _remote_action(self, key: str) -> tuple[ActionResult, KeyParts] | None:
        """The remote result of ``key`` and the key parts stored with it, once the
        gate admits them; None for a miss (a refused entry warned about)."""
        try:
            raw = self.remote.get_ac(key)
            if raw is None:
                return None
            outputs, (meta_digest, meta_size) = parse_action_result(raw)
            if meta_size > MAX_META_BYTES:
                raise gate.Refused(f"its metadata blob claims {meta_size} bytes, more than "
                                   f"the {MAX_META_BYTES} one may have")
            meta_file = self.tmp / f"{os.getpid()}-meta-{os.urandom(6).hex()}"
            try:
                if not self.remote.get_cas(meta_digest, meta_file, size=meta_size):
                    return None
                meta = gate.load_json(meta_file.read_bytes(), MAX_META_BYTES)
            finally:
                meta_file.unlink(missing_ok=True)
            if not isinstance(meta, dict) or meta.get("format") != _FORMAT:
                raise gate.Refused("unknown metadata format")
            result, components = gate.admit(
                {"outputs": outputs, "declared": meta.get("declared"),
                 "info": meta.get("info"), "warnings": meta.get("warnings", []),
                 "providers": meta.get("providers") or {}, "log": meta.get("log"),
                 "sources": meta.get("sources")},
                key, meta.get("components"), origin="remote")
            # Like bazel-remote: an entry whose blobs are gone is a miss.
            for entry in result.outputs:
                if self.remote.cas_size(entry.digest) not in (entry.size, -1):
                    return None
        except gate.Refused as exc:
            self._refused(key, exc)
            return None
        except DigestMismatch as exc:
            self._give_up(f"a blob did not match its digest ({exc})")
            return None
        except RemoteError as exc:
            self._give_up(str(exc))
            return None
        except OSError as exc:  # the metadata's temporary file
            self._give_up(f"cannot keep a download ({exc.strerror or type(exc).__name__})")
            return None
        self._note_sizes(result)
        return result, components

    def put_action(self, key: str, result: ActionResult) -> None:
        self.local.put_action(key, result)
        self._note_sizes(result)
        if result.origin == "remote":
            return  # a remote worker made it and wrote its entry (``publish``)
        if not self.upload or not self.usable:
            return
        if any(e.path == RESULT_PATH for e in result.outputs):
            return  # cannot be told apart from our metadata: keep it local
        meta = self._meta(key, result)
        if meta is None:
            return
        with self._lock:
            if self._pool is None:
                import concurrent.futures

                self._pool = concurrent.futures.ThreadPoolExecutor(
                    _UPLOAD_THREADS, thread_name_prefix="qbuild-upload")
            self._futures.append(self._pool.submit(
                self._upload, key, [e.to_json() for e in result.outputs], meta))

    def put_results(self, items: list[tuple[str, KeyParts, ActionResult]]) -> None:
        """Each item as ``put_components`` and ``put_action`` record it: each result is
        uploaded on its own (which is why ``defer_sync`` says no to batches)."""
        for key, parts, result in items:
            self.put_components(key, parts)
            self.put_action(key, result)

    def defer_sync(self) -> bool:
        """False: each entry is written and uploaded on its own (``put_action``)."""
        return False

    def _meta(self, key: str, result: ActionResult) -> dict[str, Any] | None:
        """The metadata blob of ``key``'s entry, or None (nothing is uploaded) when the
        key parts recorded for it do not make ``key``: no reader could admit it."""
        components = self.local.get_components(key)
        try:
            gate.bound_parts(components, key)
        except gate.Refused:
            with self._lock:
                self.unbound_skipped += 1
            return None
        meta = {"format": _FORMAT, "declared": list(result.declared),
                "info": dict(result.info), "warnings": list(result.warnings),
                "components": components}
        if result.providers:
            meta["providers"] = dict(result.providers)
        if result.log is not None:
            meta["log"] = result.log.to_json()
        if result.sources:
            meta["sources"] = dict(result.sources)
        return meta

    def publish(self, key: str, result: ActionResult) -> None:
        """Upload a result now, in this thread, whatever ``upload`` says (a remote
        worker's results): every blob, then the metadata, then the entry. Raises
        RemoteError or OSError; the store stays usable for the next call."""
        if any(e.path == RESULT_PATH for e in result.outputs):
            raise RemoteError(f"an output is named {RESULT_PATH}, which qbuild's metadata "
                              "uses")
        meta = self._meta(key, result)
        if meta is None:
            raise RemoteError("the key parts recorded for the result do not make its key")
        if not self._send(key, [e.to_json() for e in result.outputs], meta):
            raise RemoteError("an output blob left the local cache before its upload")

    def _send(self, key: str, outputs: list[dict[str, Any]], meta: dict[str, Any]) -> bool:
        meta_bytes = json.dumps(meta, sort_keys=True).encode()
        meta_digest = hash_bytes(meta_bytes)
        log = [meta["log"]] if meta.get("log") else []  # a blob too, not an output
        for entry in [*outputs, *log]:
            if self.remote.cas_size(entry["digest"]) == entry["size"]:
                continue
            if not self.send_blob(entry["digest"], entry["size"]):
                return False  # gone or damaged: better no entry than one without blobs
        if self.remote.cas_size(meta_digest) != len(meta_bytes):
            self.remote.put_cas_bytes(meta_digest, meta_bytes)
        self.remote.put_ac(key, to_action_result(outputs, meta_digest, len(meta_bytes)))
        return True

    def _upload(self, key: str, outputs: list[dict[str, Any]], meta: dict[str, Any]) -> None:
        if not self.usable:
            return
        try:
            if not self._send(key, outputs, meta):
                return
        except RemoteError as exc:
            self._give_up(f"upload failed ({exc})")
            return
        except OSError as exc:
            self._give_up(f"upload failed ({exc.strerror or type(exc).__name__})")
            return
        with self._lock:
            self.uploads_done += 1

    def _repair(self) -> None:
        """Upload the right bytes of blobs the server served wrong, if this build made
        them (running the action again gives the same digest): the server stops serving
        garbage. Only the bytes of the digest can be written, so this is always safe."""
        if not self.upload:
            return
        with self._lock:
            bad, self._bad_blobs = self._bad_blobs, set()
        for digest in sorted(bad):
            try:
                if not self.send_blob(digest):
                    continue
            except (RemoteError, OSError):
                return
            self.blobs_repaired += 1

    def send_blob(self, digest: str, size: int | None = None) -> bool:
        """Upload the local blob of ``digest`` (of ``size`` bytes, when given) from a
        private copy checked against the digest first (``LocalStore.restore_blob``:
        hashed while copied unless this store verified the file and it is untouched
        since), so the server is never sent bytes that are not the blob, whatever
        happened to the file after it was stored. False, nothing sent, when the local
        copy is gone or damaged (a damaged one is dropped). Raises RemoteError or
        OSError."""
        temp = self.tmp / f"{os.getpid()}-send-{os.urandom(6).hex()}"
        try:
            if not self.local.restore_blob(digest, temp):
                return False
            length = temp.stat().st_size
            if size is not None and length != size:
                return False
            self.remote.put_cas(digest, temp, length)
        finally:
            temp.unlink(missing_ok=True)
        return True

    def flush(self) -> None:
        """Wait for the uploads started so far."""
        with self._lock:
            futures, self._futures = self._futures, []
        for future in futures:
            future.result()

    def drop_action(self, key: str) -> None:
        self.local.drop_action(key)

    def get_components(self, key: str) -> KeyParts | None:
        return self.local.get_components(key)

    def put_components(self, key: str, components: KeyParts) -> None:
        self.local.put_components(key, components)

    def lock_action(self, key: str) -> KeyLock | None:
        return self.local.lock_action(key)

    def get_code(self, digest: str) -> dict[str, str] | None:
        return self.local.get_code(digest)

    def put_code(self, digest: str, files: dict[str, str]) -> None:
        self.local.put_code(digest, files)

    # -- blobs --------------------------------------------------------------------------------
    def has_blob(self, digest: str) -> bool:
        return self.local.has_blob(digest)

    def put_blob(self, path: Path, digest: str, adopt: bool = False,
                 hashed: os.stat_result | None = None) -> bool:
        return self.local.put_blob(path, digest, adopt, hashed)

    def restore_blob(self, digest: str, dest: Path, executable: bool = False) -> bool:
        if self.local.restore_blob(digest, dest, executable):
            return True
        if not self.usable:
            return False
        with self._lock:
            gate = self._fetching.setdefault(digest, threading.Lock())
        with gate:  # one download per blob even when several actions need it
            if self.local.restore_blob(digest, dest, executable):
                return True
            if not self._download(digest):
                return False
        return self.local.restore_blob(digest, dest, executable)

    def _download(self, digest: str) -> bool:
        temp = self.tmp / f"{os.getpid()}-blob-{os.urandom(6).hex()}"
        try:
            with self._lock:
                size = self._sizes.get(digest)
            if not self.remote.get_cas(digest, temp, size=size):
                return False
            self.local.put_blob(temp, digest)
        except DigestMismatch as exc:
            with self._lock:
                self._bad_blobs.add(digest)
            self._give_up(f"blob {digest[:12]} did not match its digest ({exc})")
            return False
        except RemoteError as exc:
            self._give_up(str(exc))
            return False
        finally:
            temp.unlink(missing_ok=True)
        with self._lock:
            self.blobs_downloaded += 1
        return True

    # Links and their checks are on the local copy (a blob not here is not linked: it
    # is downloaded by ``restore_blob``).
    def link_blob(self, digest: str, dest: Path) -> tuple[Path, os.stat_result] | None:
        return self.local.link_blob(digest, dest)

    def trusts(self, digest: str, st: os.stat_result) -> bool:
        return self.local.trusts(digest, st)

    def vouch(self, digest: str, st: os.stat_result) -> None:
        self.local.vouch(digest, st)

    def discard_blob(self, digest: str, inode: tuple[int, int]) -> None:
        self.local.discard_blob(digest, inode)

    # -- the rest is local ----------------------------------------------------------------------
    def memo_get(self, key: str) -> str | None:
        return self.local.memo_get(key)

    def memo_put(self, key: str, digest: str) -> None:
        self.local.memo_put(key, digest)

    def volume(self) -> int:
        return self.local.volume()

    def summary(self) -> dict[str, Any]:
        """What the remote cache did in this build (for the summary and the event log)."""
        started = time.monotonic()
        self.flush()
        self._repair()
        return {"url": self.remote.display_url, "hits": self.remote_hits,
                "upload_wait_seconds": round(time.monotonic() - started, 3),
                "blobs_downloaded": self.blobs_downloaded,
                "bytes_downloaded": self.remote.bytes_downloaded,
                "results_uploaded": self.uploads_done,
                "bytes_uploaded": self.remote.bytes_uploaded, "ok": self.usable,
                "blobs_repaired": self.blobs_repaired,
                "entries_refused": self.entries_refused,
                "problem": self.problem}

    def close(self) -> None:
        try:
            self.flush()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
            self.remote.close()
            self.local.close()


if TYPE_CHECKING:
    from ..core.protocols import Store

    _A_STORE: type[Store] = LayeredStore  # mypy proves it implements every member of Store
