"""The remote cache is never sent a blob whose bytes are not its digest's (issue 24,
suspected: "the repair path re-uploads local blobs without re-hashing").

A local blob file damaged on disk after it was stored (same name, other bytes) must not
travel: not when a build repairs a blob the server served wrong, not when it uploads a
result. The server (``FaultServer``) checks every blob it is sent against the digest it
is sent under."""

from __future__ import annotations

import hashlib
import os

import pytest
import toy_rules
from remote_servers import FaultServer

from qbuild.store.http import RemoteConfig
from qbuild.store.local import LocalStore
from qbuild.store.remote import LayeredStore
from qbuild.testing import Workspace


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class _Checking(FaultServer):
    """A working cache that records every blob PUT whose bytes are not its digest's."""

    def __init__(self) -> None:
        super().__init__()
        self.lies: list[str] = []
        self.on_put = self._check

    def _check(self, path: str) -> None:
        if "/cas/" in path:
            with self.lock:
                body = self.blobs[path]
            if sha(body) != path.rsplit("/", 1)[1]:
                self.lies.append(path)


@pytest.fixture
def fault():
    server = _Checking()
    yield server
    server.stop()


def damage(store: LocalStore, digest: str) -> None:
    """Change the bytes of the stored blob file of ``digest`` (same size, same name)."""
    path = store._blob_path(digest)
    assert path is not None
    data = path.read_bytes()
    os.chmod(path, 0o644)
    path.write_bytes(bytes(reversed(data)))
    assert sha(path.read_bytes()) != digest


def layered(tmp_path, url: str) -> LayeredStore:
    store = LayeredStore(LocalStore(tmp_path / "cache"), RemoteConfig(url=url, timeout=5))
    store.warn = lambda text: None
    return store


def test_a_repair_never_sends_a_damaged_local_blob(tmp_path, fault):
    good = b"the right bytes\n" * 64
    digest = sha(good)
    fault.blobs[f"/cas/{digest}"] = bytes(reversed(good))  # served wrong
    store = layered(tmp_path, fault.url)
    try:
        assert not store.restore_blob(digest, tmp_path / "got")  # refused, to be repaired
        made = tmp_path / "made"
        made.write_bytes(good)
        store.put_blob(made, digest)  # this machine made the right bytes again...
        damage(store.local, digest)  # ...and the file was damaged before the repair
        summary = store.summary()
    finally:
        store.close()
    assert fault.lies == []
    assert summary["blobs_repaired"] == 0


def test_a_repair_sends_an_intact_local_blob(tmp_path, fault):
    good = b"the right bytes\n" * 64
    digest = sha(good)
    fault.blobs[f"/cas/{digest}"] = bytes(reversed(good))
    store = layered(tmp_path, fault.url)
    try:
        assert not store.restore_blob(digest, tmp_path / "got")
        made = tmp_path / "made"
        made.write_bytes(good)
        store.put_blob(made, digest)
        summary = store.summary()
    finally:
        store.close()
    assert fault.lies == [] and summary["blobs_repaired"] == 1
    assert fault.blobs[f"/cas/{digest}"] == good


def test_an_upload_never_sends_a_damaged_local_blob(tmp_path, fault):
    """A result made here whose output blob is damaged before its upload: nothing of it
    is sent (an entry whose blob is missing would be a miss for every reader anyway)."""
    ws = Workspace(tmp_path / "ws", tmp_path / "cache")
    ws.register(toy_rules)
    ws.write("p/a.txt", "alpha\n")
    ws.write("p/BUILD.toml", '[one]\nrule = "concat"\nsrcs = ["a.txt"]\n')
    assert ws.build("//p:one").ok
    from qbuild.build.state import WorkspaceState

    key = WorkspaceState(ws.path("qbuild-out")).last_keys["//p:one"]
    store = layered(tmp_path, fault.url)
    try:
        result = store.get_action(key)
        assert result is not None
        (entry,) = result.outputs
        damage(store.local, entry.digest)
        store.put_action(key, result)
        store.flush()
    finally:
        store.close()
    assert fault.lies == []
    assert f"/cas/{entry.digest}" not in fault.blobs
    assert fault.count("PUT", "ac") == 0  # no entry without its blob
