"""Real HTTP cache servers on 127.0.0.1 for the remote-cache tests.

- ``Wsgidav``: the wsgidav WebDAV server from PyPI (cheroot), in a subprocess.
- ``Nginx``: Debian's nginx with its WebDAV module (PUT), in a subprocess, as the user
  running the tests; ``nginx_binary()`` is None when it is not installed.
  Both are started by the server users run, ``examples/ci/cache_server.py``.
- ``FaultServer``: a working cache (blobs in memory) that can be switched to misbehave:
  answer errors, cut bodies short, serve wrong bytes under a digest, serve garbage action
  results, answer slowly. It records every request it receives (method, path, headers).
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
    ``reset`` (close the connection at once).
    """

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}
        self.mode = "ok"
        self.delay = 0.0
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.on_put: Callable[[str], None] | None = None  # called after a PUT is stored
        self.lock = threading.Lock()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _record(self) -> str:
                with server.lock:
                    server.requests.append((self.command, self.path, dict(self.headers)))
                if server.mode == "slow":
                    time.sleep(server.delay)
                return server.mode

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
                is_cas = "/cas/" in self.path
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

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
