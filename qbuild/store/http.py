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
import hashlib
import http.client
import netrc
import os
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

_CHUNK = 1 << 20
_MAX_AC_BYTES = 16 << 20  # an action result is a few KB; more is garbage
_HEX = frozenset("0123456789abcdef")


class RemoteError(Exception):
    """The server could not be used (transport failure or server error)."""


class DigestMismatch(Exception):
    """The server answered with bytes that do not hash to the digest asked for."""


def is_digest(text: object) -> bool:
    return isinstance(text, str) and len(text) == 64 and set(text) <= _HEX


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

    def _path(self, kind: str, digest: str) -> str:
        if not is_digest(digest):
            raise ValueError(f"not a SHA-256 digest: {digest!r}")
        return f"{self.prefix}/{kind}/{digest}"

    def _request(self, method: str, path: str, body: BinaryIO | bytes | None = None,
                 length: int = 0, headers: Mapping[str, str] | None = None
                 ) -> http.client.HTTPResponse:
        """Send one request (retried once on a keep-alive connection the server had
        closed) and return the response with its status checked for server errors."""
        all_headers = {**self._headers, **(headers or {})}
        for attempt in (0, 1):
            conn = self._connection()
            reused = not getattr(self._local, "fresh", True)
            self._local.fresh = False
            deadline = time.monotonic() + self.timeout
            try:
                conn.putrequest(method, path, skip_accept_encoding=True)
                for name, value in all_headers.items():
                    conn.putheader(name, value)
                if method == "PUT":
                    conn.putheader("Content-Length", str(length))
                conn.endheaders()
                if isinstance(body, bytes):
                    conn.send(body)
                elif body is not None:
                    sent = 0
                    while chunk := body.read(_CHUNK):
                        if time.monotonic() > deadline:
                            raise TimeoutError("upload took longer than the remote timeout")
                        conn.send(chunk)
                        sent += len(chunk)
                    if sent != length:
                        raise RemoteError("the local blob changed size while uploading")
                response = conn.getresponse()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as exc:
                self._drop()
                if attempt == 0 and reused and (body is None or isinstance(body, bytes)
                                                or _rewind(body)):
                    continue
                raise RemoteError(_describe(exc)) from None
            except (OSError, http.client.HTTPException, ssl.SSLError) as exc:
                self._drop()
                raise RemoteError(_describe(exc)) from None
            response.deadline = deadline  # type: ignore[attr-defined]
            if response.status >= 500 or response.status in (401, 403, 407, 429):
                self._finish(response)
                raise RemoteError(f"{method} answered {response.status} {response.reason}")
            return response
        raise AssertionError("unreachable")

    def _finish(self, response: http.client.HTTPResponse) -> None:
        """Read what is left of a response so the connection can be reused."""
        try:
            while response.read(_CHUNK):
                pass
        except (OSError, http.client.HTTPException):
            self._drop()
        if response.will_close:
            self._drop()

    # -- action cache ---------------------------------------------------------------------
    def get_ac(self, key: str) -> bytes | None:
        """The raw action-cache entry under ``key``, or None if there is none."""
        response = self._request("GET", self._path("ac", key),
                                 headers={"Accept": "application/json"})
        if response.status == 404:
            self._finish(response)
            return None
        if response.status != 200:
            self._finish(response)
            raise RemoteError(f"GET /ac answered {response.status} {response.reason}")
        data = bytearray()
        try:
            while chunk := response.read1(65536):
                data += chunk
                if len(data) > _MAX_AC_BYTES:
                    self._drop()
                    raise RemoteError("the action-cache entry is implausibly large")
                if time.monotonic() > response.deadline:  # type: ignore[attr-defined]
                    self._drop()
                    raise RemoteError("the download took longer than the remote timeout")
        except (OSError, http.client.HTTPException) as exc:
            self._drop()
            raise RemoteError(_describe(exc)) from None
        self._finish(response)  # read1 never marks the response done; the next request needs it
        self._count(down=len(data))
        return bytes(data)

    def put_ac(self, key: str, data: bytes) -> None:
        response = self._request("PUT", self._path("ac", key), body=data, length=len(data),
                                 headers={"Content-Type": "application/json"})
        self._finish(response)
        if response.status not in (200, 201, 204):
            raise RemoteError(f"PUT /ac answered {response.status} {response.reason}")
        self._count(up=len(data))

    # -- content-addressed store -----------------------------------------------------------
    def cas_size(self, digest: str) -> int | None:
        """The stored size of a blob (HEAD), or None if the server does not have it."""
        response = self._request("HEAD", self._path("cas", digest))
        self._finish(response)
        if response.status != 200:
            return None
        length = response.getheader("Content-Length")
        return int(length) if length and length.isdigit() else -1

    def put_cas(self, digest: str, path: Path, size: int) -> None:
        """Upload a local file as the blob ``digest`` (streamed, with its length)."""
        with open(path, "rb") as handle:
            response = self._request("PUT", self._path("cas", digest), body=handle,
                                     length=size,
                                     headers={"Content-Type": "application/octet-stream"})
        self._finish(response)
        if response.status not in (200, 201, 204):
            raise RemoteError(f"PUT /cas answered {response.status} {response.reason}")
        self._count(up=size)

    def put_cas_bytes(self, digest: str, data: bytes) -> None:
        response = self._request("PUT", self._path("cas", digest), body=data,
                                 length=len(data),
                                 headers={"Content-Type": "application/octet-stream"})
        self._finish(response)
        if response.status not in (200, 201, 204):
            raise RemoteError(f"PUT /cas answered {response.status} {response.reason}")
        self._count(up=len(data))

    def get_cas(self, digest: str, dest: Path, max_bytes: int | None = None) -> bool:
        """Stream the blob into ``dest`` and verify it; False if the server lacks it.

        Raises DigestMismatch (``dest`` removed) when the bytes are not the blob.
        """
        zstd = _zstd()
        headers = {"Accept-Encoding": "zstd"} if zstd is not None else {}
        response = self._request("GET", self._path("cas", digest), headers=headers)
        if response.status == 404:
            self._finish(response)
            return False
        if response.status != 200:
            self._finish(response)
            raise RemoteError(f"GET /cas answered {response.status} {response.reason}")
        encoding = (response.getheader("Content-Encoding") or "identity").strip().lower()
        if encoding not in ("identity", "zstd") or (encoding == "zstd" and zstd is None):
            self._finish(response)
            raise DigestMismatch(f"unexpected Content-Encoding {encoding!r}")
        hasher = hashlib.sha256()
        received = 0
        size = 0
        deadline = response.deadline  # type: ignore[attr-defined]
        try:
            with open(dest, "wb") as out:
                writer = _Hashing(out, hasher)
                sink: Any = writer
                if encoding == "zstd":
                    assert zstd is not None
                    sink = zstd.ZstdDecompressor().stream_writer(writer, closefd=False)
                while chunk := response.read1(_CHUNK):
                    received += len(chunk)
                    sink.write(chunk)
                    if time.monotonic() > deadline:
                        raise TimeoutError("the download took longer than the remote timeout")
                    if max_bytes is not None and writer.size > max_bytes:
                        raise DigestMismatch("the server sent more bytes than the blob has")
                if sink is not writer:
                    sink.flush()
                size = writer.size
        except DigestMismatch:
            self._drop()
            dest.unlink(missing_ok=True)
            raise
        except (OSError, http.client.HTTPException) as exc:
            self._drop()
            dest.unlink(missing_ok=True)
            if isinstance(exc, http.client.IncompleteRead):
                raise DigestMismatch("the body was cut short") from None
            raise RemoteError(_describe(exc)) from None
        except Exception as exc:  # a zstd frame error: garbage, not a transport problem
            self._drop()
            dest.unlink(missing_ok=True)
            raise DigestMismatch(f"undecodable body ({type(exc).__name__})") from None
        self._finish(response)
        self._count(down=received)
        if hasher.hexdigest() != digest:
            dest.unlink(missing_ok=True)
            raise DigestMismatch(f"{size} bytes that do not hash to the digest")
        return True

    def _count(self, down: int = 0, up: int = 0) -> None:
        with self._count_lock:
            self.bytes_downloaded += down
            self.bytes_uploaded += up


class _Hashing:
    """A file-like sink that hashes and counts what it writes."""

    def __init__(self, out: BinaryIO, hasher: Any) -> None:
        self.out = out
        self.hasher = hasher
        self.size = 0

    def write(self, data: bytes) -> int:
        self.out.write(data)
        self.hasher.update(data)
        self.size += len(data)
        return len(data)

    def flush(self) -> None:
        self.out.flush()


def _rewind(body: BinaryIO) -> bool:
    try:
        body.seek(0)
    except OSError:
        return False
    return True


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
