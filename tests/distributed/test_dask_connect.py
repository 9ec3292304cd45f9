"""``--remote_executor`` at a port that accepts TCP but does not speak Dask's protocol
(a silent service, or the scheduler's HTTP dashboard, one digit away in the README's
example) is one clear error within the connect timeout, not a hang (issue 24, defect 18).
The CLI runs under a generous subprocess timeout only so that a regression fails the
test instead of hanging the suite."""

from __future__ import annotations

import http.server
import socket
import threading

import pytest
from test_summary_last import summary_is_last

from qbuild.testing import Workspace

pytest.importorskip("distributed")


class _Silent:
    """A TCP server that accepts connections and never says a byte."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


class _Dashboard:
    """An HTTP server, as the scheduler's dashboard is."""

    def __init__(self) -> None:
        self.server = http.server.ThreadingHTTPServer(
            ("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("kind", [_Silent, _Dashboard])
def test_a_port_that_does_not_speak_dask_is_one_error(tmp_path, cache_server, kind):
    server = kind()
    try:
        ws = Workspace(tmp_path / "ws", tmp_path / "cache")
        ws.write("p/a.txt", "a\n")
        ws.write("p/BUILD.toml", "[files]\nrule = 'filegroup'\nsrcs = ['a.txt']\n")
        out = ws.cli("build", "//p:files", f"--remote_cache={cache_server.url}/x",
                     f"--remote_executor=dask://127.0.0.1:{server.port}", "--remote_timeout=2",
                     timeout=40)
        assert out.code == 2, out.stderr
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
        assert f"cannot reach the Dask scheduler at dask://127.0.0.1:{server.port}" in lines[0]
        fallback = ws.cli("build", "//p:files", f"--remote_cache={cache_server.url}/x",
                          f"--remote_executor=dask://127.0.0.1:{server.port}",
                          "--remote_timeout=2", "--remote_local_fallback", timeout=40)
        assert fallback.code == 0, fallback.stderr
        assert summary_is_last(fallback.stderr), fallback.stderr  # defect 19
    finally:
        server.close()
