"""A client configured not to upload to the remote cache (``--remote_upload=false``)
gets no action-cache entries written on its behalf by the workers (issue 24, suspected
"workers publishing results for clients configured read-only": proven, fixed). The
workers still upload the outputs' blobs (content-addressed, checked on every download:
the only way bytes come back), as the client uploads its sources."""

from __future__ import annotations

import pytest
import toy_rules

from qbuild.testing import Workspace

pytest.importorskip("distributed")


def test_a_read_only_client_s_actions_leave_no_entry(tmp_path, cache_server, local_cluster):
    ws = Workspace(tmp_path / "ws", tmp_path / "cache")
    ws.register(toy_rules)
    ws.write("p/a.txt", "read only\n")
    ws.write("p/BUILD.toml", '[one]\nrule = "concat"\nsrcs = ["a.txt"]\n')
    prefix = cache_server.root / tmp_path.name
    (prefix / "ac").mkdir(parents=True)
    (prefix / "cas").mkdir()
    address = "dask://" + local_cluster.scheduler_address.removeprefix("tcp://")
    result = ws.build("//p:one", remote_cache=f"{cache_server.url}/{tmp_path.name}",
                      remote_upload=False, remote_executor=address, strategy=["*=remote"])
    assert result.ok, result.error + result.log
    assert result.remote_execution["remote_actions"] == 1
    assert result.output("//p:one").read_text() == "read only\n"
    assert list((prefix / "ac").iterdir()) == []
