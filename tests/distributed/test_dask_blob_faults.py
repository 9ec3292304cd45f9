"""Blobs between the client, the cache server and the workers (issue 24, suspected):

- "a source blob evicted from the server mid-build fails the action with no retry": a
  blob the build expects on the server is evicted between the check and the fetch. The
  build must send it again (or build here) and succeed with the right bytes, never fail
  or hang. The server (``FaultServer``) evicts the blob as the worker's download of it
  arrives, after the client saw it there, so the worker's fetch is the first to miss it.
- "local blobs are uploaded without re-hashing": the client's copy of a dependency's
  output, damaged on disk, must never be sent to the server for a worker."""

from __future__ import annotations

import hashlib
import os
import threading
import uuid

import pytest
import toy_rules
from remote_servers import FaultServer

from qbuild.store.local import LocalStore
from qbuild.testing import Workspace

pytest.importorskip("distributed")

GRAPH = """
[one]
rule = "heavy_concat"
srcs = ["a.txt"]
repeat = 2

[two]
rule = "heavy_concat"
deps = [":one"]
upper = true
"""


class _Evictor:
    """Evicts ``path`` from ``server`` when the first GET of it arrives."""

    def __init__(self, server: FaultServer, path: str) -> None:
        self.server, self.path = server, path
        self.evicted = threading.Event()
        server.on_request = self

    def __call__(self, method: str, path: str) -> None:
        if method == "GET" and path == self.path and not self.evicted.is_set():
            with self.server.lock:
                self.server.blobs.pop(path, None)
            self.evicted.set()


@pytest.fixture
def fault():
    server = FaultServer()
    yield server
    server.stop()


def make(tmp_path, name: str, text: str) -> Workspace:
    ws = Workspace(tmp_path / name, tmp_path / f"cache-{name}")
    ws.register(toy_rules)
    ws.write("p/a.txt", text)
    ws.write("p/BUILD.toml", GRAPH)
    return ws


def _address(cluster) -> str:
    return "dask://" + cluster.scheduler_address.removeprefix("tcp://")


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_a_source_evicted_before_the_worker_fetches_it_is_sent_again(tmp_path, fault,
                                                                     local_cluster):
    text = f"never seen by a worker {uuid.uuid4().hex}\n"  # no worker's cache holds it
    ws = make(tmp_path, "ws", text)
    source = f"/cas/{_sha(text)}"
    evictor = _Evictor(fault, source)
    result = ws.build("//p:two", remote_cache=fault.url, strategy=["*=remote"],
                      remote_executor=_address(local_cluster))
    assert evictor.evicted.is_set()  # the fault really happened
    assert result.ok, result.error + result.log
    assert result.output("//p:two").read_text() == (text * 2).upper()
    assert result.remote_execution["remote_actions"] == 2
    assert fault.count_path("PUT", source) == 2  # uploaded, evicted, uploaded again


def test_a_dependency_output_evicted_before_the_worker_fetches_it_is_sent_again(
        tmp_path, fault, local_cluster):
    """//p:one runs here (a light rule), //p:two on the cluster: the client uploads
    //p:one's output for it, and the server loses it before the worker asks."""
    text = f"made here {uuid.uuid4().hex}\n"
    ws = make(tmp_path, "ws", text)
    ws.write("p/BUILD.toml", GRAPH.replace('rule = "heavy_concat"\nsrcs',
                                           'rule = "concat"\nsrcs'))
    output = f"/cas/{_sha(text * 2)}"  # //p:one's out.txt
    evictor = _Evictor(fault, output)
    result = ws.build("//p:two", remote_cache=fault.url,
                      remote_executor=_address(local_cluster))
    assert evictor.evicted.is_set()
    assert result.ok, result.error + result.log
    assert result.output("//p:two").read_text() == (text * 2).upper()
    assert result.remote_execution["remote_actions"] == 1  # //p:two, on the cluster
    assert output in fault.blobs  # sent again after the eviction


def test_a_damaged_local_dependency_output_is_never_sent(tmp_path, fault, local_cluster):
    lies = []

    def check(path: str) -> None:
        with fault.lock:
            body = fault.blobs[path]
        if "/cas/" in path and hashlib.sha256(body).hexdigest() != path.rsplit("/", 1)[1]:
            lies.append(path)

    fault.on_put = check
    text = f"made here, then damaged {uuid.uuid4().hex}\n"
    ws = make(tmp_path, "ws", text)
    ws.write("p/BUILD.toml", GRAPH.replace('rule = "heavy_concat"\nsrcs',
                                           'rule = "concat"\nsrcs'))
    assert ws.build("//p:one").ok  # no remote cache: //p:one's output is only here
    store = LocalStore(ws.cache_dir)
    try:
        blob = store._blob_path(_sha(text * 2))
        assert blob is not None
        os.chmod(blob, 0o644)
        blob.write_text((text * 2)[::-1])  # same name, same size, other bytes
    finally:
        store.close()
    result = ws.build("//p:two", remote_cache=fault.url,
                      remote_executor=_address(local_cluster))
    assert lies == []
    assert result.ok, result.error + result.log
    assert result.output("//p:two").read_text() == (text * 2).upper()
    assert "restored //p:one" in result.log


@pytest.mark.parametrize("mode", ["wrong_bytes", "truncate", "error"])
def test_a_failing_cache_server_builds_here_with_the_fallback(tmp_path, fault, local_cluster,
                                                             mode):
    """The worker cannot fetch the inputs (wrong bytes, cut bodies), or the client gives
    up on the server (5xx to everything): with --remote_local_fallback the actions run
    here; without it, the build fails in one line."""
    text = f"a failing server {uuid.uuid4().hex}\n"
    fault.mode = mode
    ws = make(tmp_path, "ws", text)
    result = ws.build("//p:two", remote_cache=fault.url, strategy=["*=remote"],
                      remote_executor=_address(local_cluster), remote_timeout=2,
                      remote_local_fallback=True)
    assert result.ok, result.error + result.log
    assert result.output("//p:two").read_text() == (text * 2).upper()
    assert result.remote_execution["remote_actions"] == 0
    assert result.remote_execution["local_actions"] == 2
    ws.write("p/a.txt", text + "again\n")
    failed = ws.build("//p:two", remote_cache=fault.url, strategy=["*=remote"],
                      remote_executor=_address(local_cluster), remote_timeout=2)
    assert not failed.ok and failed.exit_code == 1
    assert "remote cache" in failed.error and "Traceback" not in failed.log


def test_without_a_cluster_an_output_evicted_after_the_hit_is_built_here(tmp_path, fault):
    text = f"from the remote cache {uuid.uuid4().hex}\n"
    first = make(tmp_path, "first", text)
    assert first.build("//p:two", remote_cache=fault.url).ok
    second = make(tmp_path, "second", text)
    evictor = _Evictor(fault, f"/cas/{_sha((text * 2).upper())}")  # //p:two's output
    result = second.build("//p:two", remote_cache=fault.url)
    assert evictor.evicted.is_set()
    assert sorted(result.remote_hits) == ["//p:one", "//p:two"]
    assert result.ok, result.error + result.log
    assert result.output("//p:two").read_text() == (text * 2).upper()
    assert "restored //p:two" in result.log
