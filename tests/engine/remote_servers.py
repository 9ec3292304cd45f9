"""Real HTTP cache servers on 127.0.0.1 for the remote-cache tests.

- ``Wsgidav``: the wsgidav WebDAV server from PyPI (cheroot), in a subprocess.
- ``Nginx``: Debian's nginx with its WebDAV module (PUT), in a subprocess, as the user
  running the tests; ``nginx_binary()`` is None when it is not installed.
- ``FaultServer``: a working cache (blobs in memory) that can be switched to misbehave:
  answer errors, cut bodies short, serve wrong bytes under a digest, serve garbage action
  results, answer slowly. It records every request it receives (method, path, headers).
"""

from __future__ import annotations

import getpass
import grp
import http.server
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_listening(port: int, proc: subprocess.Popen, log: Path, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {log.read_text(errors='replace')[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"server did not listen on {port}: {log.read_text(errors='replace')}")


class _Process:
    proc: subprocess.Popen
    url: str
    root: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def files(self, kind: str) -> list[Path]:
        folder = self.root / kind
        return sorted(p for p in folder.iterdir() if p.is_file()) if folder.is_dir() else []


class Wsgidav(_Process):
    """wsgidav serving ``root`` (with ac/ and cas/ created, as WebDAV PUT needs)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "ac").mkdir(parents=True, exist_ok=True)
        (root / "cas").mkdir(exist_ok=True)
        port = free_port()
        log = root.parent / f"wsgidav-{port}.log"
        code = "import sys; from wsgidav.server.server_cli import run; sys.exit(run())"
        with open(log, "wb") as handle:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", code, "--host", "127.0.0.1", "--port", str(port),
                 "--root", str(root), "--auth", "anonymous", "--no-config", "-q"],
                stdout=handle, stderr=subprocess.STDOUT, cwd=root.parent)
        _wait_listening(port, self.proc, log)
        self.url = f"http://127.0.0.1:{port}"


def nginx_binary() -> str | None:
    return shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.access(p, os.X_OK)),
        None)


_NGINX_CONF = """
{user}
worker_processes 1;
pid {state}/nginx.pid;
error_log {state}/error.log;
daemon off;
events {{ worker_connections 256; }}
http {{
    access_log {state}/access.log;
    client_body_temp_path {state}/body;
    proxy_temp_path {state}/proxy;
    fastcgi_temp_path {state}/fastcgi;
    uwsgi_temp_path {state}/uwsgi;
    scgi_temp_path {state}/scgi;
    server {{
        listen 127.0.0.1:{port};
        root {root};
        client_max_body_size 0;
        location / {{
            dav_methods PUT;
            create_full_put_path on;
            dav_access user:rw group:r all:r;
        }}
    }}
}}
"""


class Nginx(_Process):
    """Debian's nginx storing PUT bodies under ``root`` (WebDAV module, temp files first)."""

    def __init__(self, root: Path, binary: str) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        state = root.parent / f"nginx-state-{os.getpid()}-{id(self)}"
        state.mkdir(parents=True, exist_ok=True)
        port = free_port()
        # As root the workers would drop to "nobody"; keep them as the tests' user.
        user = (f"user {getpass.getuser()} {grp.getgrgid(os.getgid()).gr_name};"
                if os.geteuid() == 0 else "")
        conf = state / "nginx.conf"
        conf.write_text(_NGINX_CONF.format(user=user, state=state, port=port, root=root))
        log = state / "stderr.log"
        with open(log, "wb") as handle:
            self.proc = subprocess.Popen([binary, "-p", str(state), "-c", str(conf)],
                                         stdout=handle, stderr=subprocess.STDOUT)
        _wait_listening(port, self.proc, log)
        self.url = f"http://127.0.0.1:{port}"


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
