"""The client side of Bazel's HTTP remote-cache protocol (what bazel-remote, nginx with
WebDAV and wsgidav serve): ``GET``/``HEAD``/``PUT`` on ``<prefix>/ac/<sha256>`` and
``<prefix>/cas/<sha256>``, on the standard library's ``http.client`` only.

Owns: the URL and its credentials (``.netrc``, environment, ``--remote_header``; never
shown: ``display_url`` is what messages use), one keep-alive connection per thread,
deadlines, streaming in both directions and digest verification of every download.
Blobs are streamed from and to files, never held whole in memory; a download whose bytes
do not hash to the digest asked for is discarded and reported as ``DigestMismatch``. zstd
transfer encoding is asked for only when the optional ``zstandard`` package is installed.

Errors of the transport (refused, reset, timeout, a 5xx answer, TLS) raise
``RemoteError``; the layer above turns the first one into a warning and stops using the
server for the rest of the build. A 404 is a miss, not an error.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.client
import netrc
import os
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

from .gate import is_digest

_CHUNK = 1 << 20
_MAX_AC_BYTES = 16 << 20  # an action result is a few KB; more is garbage
_MAX_DRAIN = 64 << 10  # an error page read to keep its connection; a longer one drops it
_TRANSIENT = frozenset((429, 500, 502, 503, 504))
_FIRST_PAUSE = 0.05  # seconds before the first retry; each next one waits 4 times longer
_MAX_PAUSE = 2.0
T = TypeVar("T")


class RemoteError(Exception):
    """The server could not be used (transport failure or server error)."""


class DigestMismatch(Exception):
    """The server answered with bytes that do not hash to the digest asked for."""


def _zstd() -> Any | None:
    if os.environ.get("QBUILD_REMOTE_NO_ZSTD"):
        return None
    try:
        import zstandard
    except ImportError:
        return None
    return zstandard


@dataclass
class RemoteConfig:
    """Where the cache is and how to talk to it (resolved from flags, env, qbuild.toml)."""

    url: str
    upload: bool = True
    timeout: float = 60.0
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    environ: Mapping[str, str] = field(default_factory=dict, repr=False)


class HttpCache:
    """A Bazel HTTP cache at one URL. Thread-safe: each thread has its own connection."""

    def __init__(self, config: RemoteConfig) -> None:
        parts = urllib.parse.urlsplit(config.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("the remote cache URL must look like http(s)://host[:port][/prefix]")
        self.https = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.https else 80)
        self.prefix = parts.path.rstrip("/")
        host_text = f"[{self.host}]" if ":" in self.host else self.host
        self.display_url = f"{parts.scheme}://{host_text}:{self.port}{self.prefix}"
        self.timeout = config.timeout
        self._headers = dict(config.headers)
        if not any(name.lower() == "authorization" for name in self._headers):
            auth = _credentials(parts, self.host, config.environ)
            if auth is not None:
                self._headers["Authorization"] = auth
        self._local = threading.local()
        self._ssl = ssl.create_default_context() if self.https else None
        self.bytes_downloaded = 0
        self.bytes_uploaded = 0
        self._count_lock = threading.Lock()
        self._watchdog = _Watchdog()

    # -- connections ----------------------------------------------------------------------
    def _connection(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            if self.https:
                conn = http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout,
                                                   context=self._ssl)
            else:
                conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            self._local.conn = conn
            self._local.fresh = True
        return conn

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            conn.close()

    def close(self) -> None:
        self._drop()
        self._watchdog.close()

    def _path(self, kind: str, digest: str) -> str:
        if not is_digest(digest):
            raise ValueError(f"not a SHA-256 digest: {digest!r}")
        return f"{self.prefix}/{kind}/{digest}"

    def _exchange(self, method: str, path: str, reader: Callable[[Any], T],
                  body: BinaryIO | bytes | None = None, length: int = 0,
                  headers: Mapping[str, str] | None = None) -> T:
        """One request and ``reader``'s reading of its answer (status 200, 201, 204 or
        404; any other raises ``RemoteError``), all of it (connecting, sending, the
        status line and headers, every byte of the body, retries) within one deadline
        of ``timeout`` seconds. A 5xx or 429 answer, or a keep-alive connection the
        server had closed, is tried again with backoff while the deadline allows."""
        all_headers = {**self._headers, **(headers or {})}
        deadline = time.monotonic() + self.timeout
        pause = _FIRST_PAUSE
        while True:
            conn = self._connection()
            reused = not getattr(self._local, "fresh", True)
            self._local.fresh = False
            token = None
            retry: BaseException
            try:
                if conn.sock is None:
                    conn.timeout = max(0.001, deadline - time.monotonic())
                    conn.connect()
                token = self._watchdog.arm(conn.sock, deadline)
                self._send(conn, method, path, all_headers, body, length)
                response = conn.getresponse()
                self._check_status(method, response)
                result = reader(response)
                self._finish(response)
                if self._watchdog.disarm(token):
                    raise RemoteError(self._late())
                return result
            except _Transient as exc:
                if self._watchdog.disarm(token):  # (its error page outlasted the deadline)
                    raise RemoteError(f"{exc}; {self._late()}") from None
                retry = exc
            except (http.client.RemoteDisconnected, BrokenPipeError,
                    ConnectionResetError) as exc:
                self._drop()
                if self._watchdog.disarm(token):
                    raise RemoteError(self._late()) from None
                if not reused or not _rewind(body):
                    raise RemoteError(_describe(exc)) from None
                retry = exc
                pause = 0.0  # the server closed an idle connection: at once
            except (DigestMismatch, RemoteError, OSError, http.client.HTTPException,
                    ssl.SSLError, ValueError) as exc:
                self._drop()
                if self._watchdog.disarm(token):
                    raise RemoteError(self._late()) from None
                if isinstance(exc, (DigestMismatch, RemoteError)):
                    raise
                raise RemoteError(_describe(exc)) from None
            finally:
                self._watchdog.disarm(token)
            left = deadline - time.monotonic()
            if left <= pause or not _rewind(body):
                raise RemoteError(str(retry) if isinstance(retry, _Transient)
                                  else _describe(retry)) from None
            if pause:
                time.sleep(pause)
            pause = min(max(pause * 4, _FIRST_PAUSE), _MAX_PAUSE)

    def _check_status(self, method: str, response: http.client.HTTPResponse) -> None:
        status = response.status
        if status in _TRANSIENT:
            self._finish(response)
            raise _Transient(f"{method} answered {status} {response.reason}")
        if status not in (200, 201, 204, 404):
            self._finish(response)
            why = " (redirects are not followed)" if 300 <= status < 400 else ""
            raise RemoteError(f"{method} answered {status} {response.reason}{why}")

    def _late(self) -> str:
        return f"no complete answer within the remote timeout ({self.timeout:g} s)"

    def _send(self, conn: http.client.HTTPConnection, method: str, path: str,
              headers: Mapping[str, str], body: BinaryIO | bytes | None, length: int) -> None:
        conn.putrequest(method, path, skip_accept_encoding=True)
        for name, value in headers.items():
            conn.putheader(name, value)
        if method == "PUT":
            conn.putheader("Content-Length", str(length))
        conn.endheaders()
        if isinstance(body, bytes):
            conn.send(body)
        elif body is not None:
            sent = 0
            while chunk := body.read(_CHUNK):
                conn.send(chunk)
                sent += len(chunk)
            if sent != length:
                raise RemoteError("the local blob changed size while uploading")

    def _finish(self, response: http.client.HTTPResponse) -> None:
        """Read what is left of a response (at most ``_MAX_DRAIN`` bytes: an error
        page, a 404's body) so the connection can be reused; drop it otherwise."""
        left = _MAX_DRAIN
        try:
            while left > 0 and (chunk := response.read(min(left, 65536))):
                left -= len(chunk)
            if not response.isclosed():
                self._drop()
        except (OSError, http.client.HTTPException):
            self._drop()
        if response.will_close:
            self._drop()

    # -- action cache ---------------------------------------------------------------------
    def get_ac(self, key: str) -> bytes | None:
        """The raw action-cache entry under ``key``, or None if there is none."""
        def read(response: http.client.HTTPResponse) -> bytes | None:
            if response.status == 404:
                return None
            if response.status != 200:
                raise RemoteError(f"GET /ac answered {response.status} {response.reason}")
            data = bytearray()
            while chunk := response.read1(65536):
                data += chunk
                if len(data) > _MAX_AC_BYTES:
                    raise RemoteError("the action-cache entry is implausibly large")
            return bytes(data)

        data = self._exchange("GET", self._path("ac", key), read,
                              headers={"Accept": "application/json"})
        if data is not None:
            self._count(down=len(data))
        return data

    def put_ac(self, key: str, data: bytes) -> None:
        self._exchange("PUT", self._path("ac", key), _stored("PUT /ac"), body=data,
                       length=len(data), headers={"Content-Type": "application/json"})
        self._count(up=len(data))

    # -- content-addressed store -----------------------------------------------------------
    def cas_size(self, digest: str) -> int | None:
        """The stored size of a blob (HEAD), or None if the server does not have it."""
        def read(response: http.client.HTTPResponse) -> int | None:
            if response.status != 200:
                return None
            length = response.getheader("Content-Length")
            return int(length) if length and length.isdigit() and len(length) < 20 else -1

        return self._exchange("HEAD", self._path("cas", digest), read)

    def put_cas(self, digest: str, path: Path, size: int) -> None:
        """Upload a local file as the blob ``digest`` (streamed, with its length)."""
        with open(path, "rb") as handle:
            self._exchange("PUT", self._path("cas", digest), _stored("PUT /cas"),
                           body=handle, length=size,
                           headers={"Content-Type": "application/octet-stream"})
        self._count(up=size)

    def put_cas_bytes(self, digest: str, data: bytes) -> None:
        self._exchange("PUT", self._path("cas", digest), _stored("PUT /cas"), body=data,
                       length=len(data), headers={"Content-Type": "application/octet-stream"})
        self._count(up=len(data))

    def get_cas(self, digest: str, dest: Path, size: int | None = None) -> bool:
        """Stream the blob into ``dest`` and verify it; False if the server lacks it.

        ``size`` is the blob's size as its entry states it: no more bytes than that are
        ever written (decompressed ones included), and no more than about that many are
        received. Without it, the download is plain (no compression) and bounded by the
        answer's ``Content-Length``, which it must have. Raises DigestMismatch
        (``dest`` removed) when the bytes are not the blob.
        """
        zstd = _zstd() if size is not None else None
        headers = {"Accept-Encoding": "zstd"} if zstd is not None else {}
        received = 0

        def read(response: http.client.HTTPResponse) -> bool:
            nonlocal received
            if response.status == 404:
                return False
            if response.status != 200:
                raise RemoteError(f"GET /cas answered {response.status} {response.reason}")
            encoding = (response.getheader("Content-Encoding") or "identity").strip().lower()
            if encoding not in ("identity", "zstd") or (encoding == "zstd" and zstd is None):
                raise DigestMismatch(f"unexpected Content-Encoding {encoding!r}")
            limit = size
            if limit is None:
                length = response.getheader("Content-Length") or ""
                if not length.isdigit() or len(length) > 19:
                    raise RemoteError("a blob of unknown size came without a Content-Length")
                limit = int(length)
            # zstd adds a few bytes per 128 KiB block; a body much longer is not the blob
            most = limit if encoding == "identity" else limit + (limit >> 6) + (64 << 10)
            hasher = hashlib.sha256()
            with open(dest, "wb") as out:
                writer = _Hashing(out, hasher, limit)
                sink: Any = writer
                if encoding == "zstd":
                    assert zstd is not None
                    sink = zstd.ZstdDecompressor().stream_writer(writer, closefd=False)
                try:
                    while chunk := response.read1(min(_CHUNK, most - received + 1)):
                        received += len(chunk)
                        if received > most:
                            raise DigestMismatch("the server sent more bytes than the "
                                                 "blob has")
                        sink.write(chunk)
                    if sink is not writer:
                        sink.flush()
                except (DigestMismatch, OSError, http.client.HTTPException):
                    raise
                except Exception as exc:  # a zstd frame error: garbage, not transport
                    raise DigestMismatch(f"undecodable body ({type(exc).__name__})") from None
            if hasher.hexdigest() != digest:
                raise DigestMismatch(f"{writer.size} bytes that do not hash to the digest")
            return True

        try:
            found = self._exchange("GET", self._path("cas", digest), read, headers=headers)
        except (DigestMismatch, RemoteError):
            dest.unlink(missing_ok=True)
            raise
        self._count(down=received)
        return found

    def _count(self, down: int = 0, up: int = 0) -> None:
        with self._count_lock:
            self.bytes_downloaded += down
            self.bytes_uploaded += up


class _Hashing:
    """A file-like sink that hashes and counts what it writes, and refuses to write
    past ``limit`` bytes (a decompressor writes through it, so a compression bomb stops
    at the blob's size)."""

    def __init__(self, out: BinaryIO, hasher: Any, limit: int) -> None:
        self.out = out
        self.hasher = hasher
        self.size = 0
        self.limit = limit

    def write(self, data: bytes) -> int:
        if self.size + len(data) > self.limit:  # checked before a byte of it is written
            raise DigestMismatch(f"the server sent more than the blob's {self.limit} bytes")
        self.out.write(data)
        self.hasher.update(data)
        self.size += len(data)
        return len(data)

    def flush(self) -> None:
        self.out.flush()


def _rewind(body: BinaryIO | bytes | None) -> bool:
    if body is None or isinstance(body, bytes):
        return True
    try:
        body.seek(0)
    except OSError:
        return False
    return True


def _stored(what: str) -> Callable[[http.client.HTTPResponse], None]:
    def read(response: http.client.HTTPResponse) -> None:
        if response.status not in (200, 201, 204):
            raise RemoteError(f"{what} answered {response.status} {response.reason}")
    return read


class _Transient(Exception):
    """A 5xx or 429 answer: worth asking again after a pause."""


class _Watchdog:
    """Shuts down the socket of every request still running at its deadline, so no
    read or write of it (a status line or error page trickled byte by byte included)
    outlives the deadline: a socket's own timeout only bounds each single read."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._armed: dict[int, tuple[float, socket.socket]] = {}
        self._fired: set[int] = set()
        self._next = 0
        self._thread: threading.Thread | None = None
        self._closed = False

    def arm(self, sock: socket.socket | None, deadline: float) -> int:
        with self._cond:
            self._next += 1
            token = self._next
            if sock is not None:
                self._armed[token] = (deadline, sock)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="qbuild-remote-deadline",
                                                daemon=True)
                self._thread.start()
            self._cond.notify()
            return token

    def disarm(self, token: int | None) -> bool:
        """Stop watching ``token``'s request; True if its deadline had passed."""
        if token is None:
            return False
        with self._cond:
            self._armed.pop(token, None)
            if token in self._fired:
                self._fired.discard(token)
                return True
            return False

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _run(self) -> None:
        with self._cond:
            while not self._closed:
                now = time.monotonic()
                for token, (deadline, sock) in list(self._armed.items()):
                    if deadline <= now:
                        del self._armed[token]
                        self._fired.add(token)
                        with contextlib.suppress(OSError):
                            sock.shutdown(socket.SHUT_RDWR)
                wake = min((d for d, _ in self._armed.values()), default=None)
                self._cond.wait(None if wake is None else max(0.0, wake - now))


def _describe(exc: BaseException) -> str:
    """A message about a transport error that cannot contain headers or credentials."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"TLS certificate not trusted ({exc.verify_message})"
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return "timed out"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, http.client.IncompleteRead):
        return "the answer was cut short"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return type(exc).__name__


def _credentials(parts: urllib.parse.SplitResult, host: str,
                 environ: Mapping[str, str]) -> str | None:
    """An Authorization header value from the URL, the environment or ~/.netrc."""
    user, password = parts.username, parts.password
    if user is None and environ.get("QBUILD_REMOTE_USER"):
        user, password = environ["QBUILD_REMOTE_USER"], environ.get("QBUILD_REMOTE_PASSWORD", "")
    if user is None:
        path = environ.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
        try:
            entry = netrc.netrc(path).authenticators(host)
        except (OSError, netrc.NetrcParseError):
            entry = None
        if entry is not None:
            user, password = entry[0], entry[2]
    if user is None:
        return None
    raw = f"{urllib.parse.unquote(user)}:{urllib.parse.unquote(password or '')}"
    return "Basic " + base64.b64encode(raw.encode()).decode("ascii")
