"""Start a Bazel HTTP cache server on 127.0.0.1 for local experiments and benchmarks.

    python examples/ci/cache_server.py --root /tmp/qbuild-cache [--kind nginx|wsgidav]

prints the URL and serves until interrupted. ``start()`` is the same from Python.
nginx (Debian's, WebDAV module) publishes a PUT only once its body is complete;
wsgidav (``pip install wsgidav cheroot``) needs ``ac/`` and ``cas/`` to exist, which
``start`` creates. Both keep every blob forever: see docs/remote-cache.md for gc.
"""

from __future__ import annotations

import argparse
import getpass
import grp
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

NGINX_CONF = """
{user}
worker_processes 2;
pid {state}/nginx.pid;
error_log {state}/error.log;
daemon off;
events {{ worker_connections 256; }}
http {{
    access_log off;
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


class Server:
    def __init__(self, proc: subprocess.Popen, url: str, root: Path, kind: str) -> None:
        self.proc, self.url, self.root, self.kind = proc, url, root, kind

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def stored_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.root.rglob("*") if p.is_file())


def nginx_binary() -> str | None:
    return shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.access(p, os.X_OK)),
        None)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait(port: int, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the cache server did not start")


def start(root: Path, kind: str = "auto") -> Server:
    """Start nginx (if installed, for ``auto``) or wsgidav serving ``root``."""
    root = Path(root).resolve()
    root.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    binary = nginx_binary()
    if kind == "auto":
        kind = "nginx" if binary else "wsgidav"
    if kind == "nginx":
        if binary is None:
            raise RuntimeError("nginx is not installed (apt-get install nginx)")
        state = root.parent / f".{root.name}-nginx"
        state.mkdir(exist_ok=True)
        user = (f"user {getpass.getuser()} {grp.getgrgid(os.getgid()).gr_name};"
                if os.geteuid() == 0 else "")
        conf = state / "nginx.conf"
        conf.write_text(NGINX_CONF.format(user=user, state=state, port=port, root=root))
        proc = subprocess.Popen([binary, "-p", str(state), "-c", str(conf)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    else:
        (root / "ac").mkdir(exist_ok=True)
        (root / "cas").mkdir(exist_ok=True)
        code = "import sys; from wsgidav.server.server_cli import run; sys.exit(run())"
        proc = subprocess.Popen(
            [sys.executable, "-c", code, "--host", "127.0.0.1", "--port", str(port),
             "--root", str(root), "--auth", "anonymous", "--no-config", "-q"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait(port, proc)
    return Server(proc, f"http://127.0.0.1:{port}", root, kind)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", required=True, type=Path)
    parser.add_argument("--kind", choices=["auto", "nginx", "wsgidav"], default="auto")
    args = parser.parse_args()
    server = start(args.root, args.kind)
    print(server.url, flush=True)
    try:
        server.proc.wait()
    except KeyboardInterrupt:
        server.stop()


if __name__ == "__main__":
    main()
