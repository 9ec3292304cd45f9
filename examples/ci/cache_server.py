"""Start a Bazel HTTP cache server on 127.0.0.1 for local experiments and benchmarks.

    python examples/ci/cache_server.py --root /tmp/qbuild-cache [--kind nginx|wsgidav]

prints the URL and serves until interrupted. ``start()`` is the same from Python.
nginx (Debian's, WebDAV module) publishes a PUT only once its body is complete;
wsgidav (``pip install wsgidav cheroot``) needs ``ac/`` and ``cas/`` to exist, which
``start`` creates. Both keep every blob forever: see docs/remote-cache.md for gc.
Each server's output goes to a log file beside ``root`` (``Server.log``), shown when it
fails to start. The project's tests start their servers through this module too.
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


class Server:
    def __init__(self, proc: subprocess.Popen, url: str, root: Path, kind: str,
                 log: Path) -> None:
        self.proc, self.url, self.root, self.kind, self.log = proc, url, root, kind, log

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

    def files(self, kind: str) -> list[Path]:
        """The blobs stored under ``ac`` or ``cas``."""
        folder = self.root / kind
        return sorted(p for p in folder.iterdir() if p.is_file()) if folder.is_dir() else []


def nginx_binary() -> str | None:
    return shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.access(p, os.X_OK)),
        None)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait(port: int, proc: subprocess.Popen, log: Path, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the cache server exited: "
                               f"{log.read_text(errors='replace')[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"the cache server did not listen on {port}: "
                       f"{log.read_text(errors='replace')[-2000:]}")


def start(root: Path, kind: str = "auto") -> Server:
    """Start nginx (if installed, for ``auto``) or wsgidav serving ``root``."""
    root = Path(root).resolve()
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    binary = nginx_binary()
    if kind == "auto":
        kind = "nginx" if binary else "wsgidav"
    state = root.parent / f".{root.name}-{kind}-{port}"
    state.mkdir(exist_ok=True)
    log = state / "server.log"
    if kind == "nginx":
        if binary is None:
            raise RuntimeError("nginx is not installed (apt-get install nginx)")
        # As root nginx's workers would drop to "nobody"; keep them as the caller.
        user = (f"user {getpass.getuser()} {grp.getgrgid(os.getgid()).gr_name};"
                if os.geteuid() == 0 else "")
        conf = state / "nginx.conf"
        conf.write_text(NGINX_CONF.format(user=user, state=state, port=port, root=root))
        argv = [binary, "-p", str(state), "-c", str(conf)]
    else:
        (root / "ac").mkdir(exist_ok=True)
        (root / "cas").mkdir(exist_ok=True)
        code = "import sys; from wsgidav.server.server_cli import run; sys.exit(run())"
        argv = [sys.executable, "-c", code, "--host", "127.0.0.1", "--port", str(port),
                "--root", str(root), "--auth", "anonymous", "--no-config", "-q"]
    with open(log, "wb") as handle:
        proc = subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT,
                                cwd=state)
    _wait(port, proc, log)
    return Server(proc, f"http://127.0.0.1:{port}", root, kind, log)


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
