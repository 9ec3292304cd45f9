"""One transient cache error must not fail targets built on the cluster (issue 24,
defect 14): the server answers the first blob download after a worker published a
result with a 503; the build must still succeed. Without the remote layer's retries of
transient answers (``store.http``: 429 and 5xx tried again with backoff inside the one
deadline) the 503 made the client give up on the remote, and both targets failed."""

from __future__ import annotations

import threading

import pytest
import toy_rules
from remote_servers import FaultServer

from qbuild.testing import Workspace

pytest.importorskip("distributed")


class _OneError(FaultServer):
    """A cache server that fails exactly one request once armed."""

    def __init__(self) -> None:
        self._armed = False
        self.errors_served = 0
        self._failing: dict[int, int] = {}
        self._once = threading.Lock()
        super().__init__()

    @property  # type: ignore[override]
    def mode(self) -> str:
        # (FaultServer reads ``mode`` twice per request: the failing request's thread
        # sees "error" both times.)
        me = threading.get_ident()
        # (no ``self.lock`` here: the server reads ``mode`` while holding it, right after
        # appending this request; taking it again would deadlock the request's thread)
        method, path, _ = self.requests[-1] if self.requests else ("", "", {})
        with self._once:
            if self._failing.get(me, 0) > 0:
                self._failing[me] -= 1
                return "error"
            if self._armed and method == "GET" and "/cas/" in path:
                self._armed = False
                self._failing[me] = 1
                self.errors_served += 1
                return "error"
        return "ok"

    @mode.setter
    def mode(self, value: str) -> None:
        pass

    def arm(self, path: str) -> None:
        if "/ac/" in path:
            with self._once:
                self._armed = True


GRAPH = """
[one]
rule = "heavy_concat"
srcs = ["a.txt"]

[two]
rule = "heavy_concat"
srcs = ["b.txt"]
"""


def test_one_transient_error_fails_no_target(tmp_path, local_cluster):
    server = _OneError()
    server.on_put = server.arm
    try:
        ws = Workspace(tmp_path / "ws", tmp_path / "cache")
        ws.register(toy_rules)
        ws.write("p/a.txt", "alpha\n")
        ws.write("p/b.txt", "beta\n")
        ws.write("p/BUILD.toml", GRAPH)
        address = "dask://" + local_cluster.scheduler_address.removeprefix("tcp://")
        result = ws.build("//p:one", "//p:two", remote_cache=server.url,
                          remote_executor=address, strategy=["*=remote"], jobs=1)
        assert server.errors_served >= 1  # the fault really happened
        assert result.ok, result.error + result.log
        assert result.output("//p:one").read_text().strip() != ""
    finally:
        server.stop()
