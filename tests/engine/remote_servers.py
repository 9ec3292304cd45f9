"""Real HTTP cache servers on 127.0.0.1 for the remote-cache tests.

- ``Wsgidav``: the wsgidav WebDAV server from PyPI (cheroot), in a subprocess.
- ``Nginx``: Debian's nginx with its WebDAV module (PUT), in a subprocess, as the user
  running the tests; ``nginx_binary()`` is None when it is not installed.
  Both are started by the server users run, ``examples/ci/cache_server.py``.
- ``FaultServer``: a working cache (blobs in memory) that can be switched to misbehave:
  answer errors, cut bodies short, serve wrong bytes under a digest, serve garbage action
  results, answer slowly, trickle status lines and error pages, redirect, answer 5xx
  storms, serve compression bombs and bodies far longer than the blob. Tests put wrong
  entries for a key, truncated or garbage JSON and huge claimed sizes straight into its
  ``blobs``. It records every request it receives (method, path, headers); ``on_request``
  sees each one before it is answered (to evict a blob between a check and a fetch).
"""

from __future__ import annotations

import http.server
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "ci"))
import cache_server  # noqa: E402


def free_port() -> int:
    return cache_server.free_port()


def nginx_binary() -> str | None:
    return cache_server.nginx_binary()


def Wsgidav(root: Path) -> cache_server.Server:  # noqa: N802 (a server, as the tests say)
    """wsgidav serving ``root`` (with ac/ and cas/ created, as WebDAV PUT needs)."""
    return cache_server.start(root, "wsgidav")


def Nginx(root: Path) -> cache_server.Server:  # noqa: N802
    """Debian's nginx storing PUT bodies under ``root`` (WebDAV module, temp files first)."""
    return cache_server.start(root, "nginx")


class FaultServer:
    """A cache server that can misbehave on purpose (``mode``), for fault tests.

    Modes: ``ok``; ``error`` (500 to everything); ``truncate`` (CAS bodies cut in half
    after promising the full length); ``wrong_bytes`` (CAS bodies replaced by other bytes
    of the same length); ``garbage_ac`` (action results that are not JSON); ``slow``
    (``delay`` seconds before answering); ``trickle`` (one byte every ``delay`` seconds);
    ``reset`` (close the connection at once); ``trickle_error`` (a 503 whose long error
    page comes one byte every ``delay`` seconds); ``trickle_headers`` (a status line, then
    header bytes one every ``delay`` seconds, never ending); ``redirect`` (every request
    answered 307 to ``redirect_to`` + its path); ``storm`` (503 to the next ``errors_left``
    requests, then working); ``bomb`` (CAS GETs answered with ``bomb_size`` zero bytes,
    zstd-compressed to a few KB); ``oversize`` (CAS GETs answered with ``bomb_size`` plain
    bytes). ``huge`` maps a path to the length of a body of that many bytes served for it
    in any mode (made as it is sent).
    """

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}
        self.mode = "ok"
        self.delay = 0.0
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.on_put: Callable[[str], None] | None = None  # called after a PUT is stored
        # called with (method, path) as each request arrives, before it is answered
        self.on_request: Callable[[str, str], None] | None = None
        self.redirect_to = ""
        self.errors_left = 0
        self.bomb_size = 64 << 20
        self.huge: dict[str, int] = {}
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _record(self) -> str:
                if server.on_request is not None:
                    server.on_request(self.command, self.path)
                with server.lock:
                    server.requests.append((self.command, self.path, dict(self.headers)))
                    mode = server.mode
                    if mode == "storm":
                        if server.errors_left > 0:
                            server.errors_left -= 1
                            mode = "error"
                        else:
                            mode = "ok"
                if mode == "slow":
                    time.sleep(server.delay)
                if mode == "redirect":
                    self.close_connection = True
                    self._send(307, b"moved", headers={
                        "Location": server.redirect_to + self.path})
                    return "answered"
                if mode == "trickle_headers":
                    self.close_connection = True
                    self.wfile.write(b"HTTP/1.1 200 OK\r\n")
                    self._trickle(b"X-Slow: " + b"a" * 10_000_000)
                    return "answered"
                if mode == "trickle_error":
                    self.close_connection = True
                    self.send_response(503)
                    self.send_header("Content-Length", "10000000")
                    self.end_headers()
                    self._trickle(b"e" * 10_000_000)
                    return "answered"
                return mode

            def _trickle(self, data: bytes) -> None:
                """Send ``data`` one byte every ``delay`` seconds until the client goes
                away (or the server stops)."""
                try:
                    for i in range(len(data)):
                        if server.stopping.wait(server.delay):
                            return
                        self.wfile.write(data[i:i + 1])
                        self.wfile.flush()
                except OSError:
                    pass

            def _send(self, status: int, body: bytes = b"", length: int | None = None,
                      head: bool = False, headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body) if length is None
                                                       else length))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def _reset(self) -> None:
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)

            def do_PUT(self) -> None:  # noqa: N802
                mode = self._record()
                if mode == "answered":
                    return
                length = int(self.headers.get("Content-Length", "-1"))
                if length < 0:
                    self._send(411)
                    return
                body = self.rfile.read(length)
                if mode == "reset":
                    self._reset()
                elif mode == "error":
                    self._send(500, b"boom")
                else:
                    with server.lock:
                        server.blobs[self.path] = body
                    self._send(201)
                    if server.on_put is not None:
                        server.on_put(self.path)

            def _get(self, head: bool) -> None:
                mode = self._record()
                if mode == "answered":
                    return
                is_cas = "/cas/" in self.path
                if self.path in server.huge:
                    self._huge(server.huge[self.path], head)
                    return
                if is_cas and not head and mode in ("bomb", "oversize"):
                    if mode == "oversize":
                        self._huge(server.bomb_size, head)
                        return
                    import zstandard

                    body = zstandard.ZstdCompressor().compress(
                        bytes(server.bomb_size))
                    self._send(200, body, headers={"Content-Encoding": "zstd"})
                    return
                if mode == "reset":
                    self._reset()
                    return
                if mode == "error":
                    self._send(503, b"unavailable", head=head)
                    return
                with server.lock:
                    body = server.blobs.get(self.path)
                if body is None:
                    self._send(404, head=head)
                    return
                if mode == "garbage_ac" and not is_cas:
                    body = b"\x00not json at all" + body[:5]
                elif mode == "wrong_bytes" and is_cas:
                    body = bytes((b + 1) % 256 for b in body) or b"x"
                elif mode == "trickle" and not head:  # each byte in time, the whole never
                    self._send(200, b"", length=len(body))
                    for i in range(len(body)):
                        self.wfile.write(body[i:i + 1])
                        self.wfile.flush()
                        time.sleep(server.delay)
                    return
                elif mode == "truncate" and is_cas and not head:
                    self._send(200, body[: len(body) // 2], length=len(body))
                    self.close_connection = True
                    return
                headers = {}
                if (is_cas and not head and mode == "zstd"
                        and "zstd" in self.headers.get("Accept-Encoding", "")):
                    import zstandard

                    body = zstandard.ZstdCompressor().compress(body)
                    headers["Content-Encoding"] = "zstd"
                self._send(200, body, head=head, headers=headers)

            def _huge(self, length: int, head: bool) -> None:
                self._send(200, b"", length=length, head=True)
                if head:
                    return
                block = bytes(1 << 20)
                try:
                    while length > 0 and not server.stopping.is_set():
                        self.wfile.write(block[:length])
                        length -= len(block)
                except OSError:
                    self.close_connection = True

            def do_GET(self) -> None:  # noqa: N802
                self._get(head=False)

            def do_HEAD(self) -> None:  # noqa: N802
                self._get(head=True)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def count(self, method: str | None = None, kind: str | None = None) -> int:
        with self.lock:
            return sum(1 for m, p, _ in self.requests if (method is None or m == method)
                       and (kind is None or f"/{kind}/" in p))

    def count_path(self, method: str, path: str) -> int:
        with self.lock:
            return sum(1 for m, p, _ in self.requests if m == method and p == path)

    def stop(self) -> None:
        self.stopping.set()
        self.httpd.shutdown()
        self.httpd.server_close()
