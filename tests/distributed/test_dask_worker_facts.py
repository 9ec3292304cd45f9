"""A Dask worker re-derives the facts its identity check compares for every request
(issue 24, defect 3): a tool upgraded on the worker's machine after the worker started
is seen by the next action's check, so the worker neither refuses a client keyed for
the new tool nor accepts one keyed for the old (and runs the new)."""

from __future__ import annotations

import os

import pytest

from qbuild.testing import Workspace

distributed = pytest.importorskip("distributed")


def _tool(folder, version: str) -> None:
    path = folder / "mytool"
    path.write_text(f"#!/bin/sh\necho {version}\n")
    path.chmod(0o755)


def test_a_tool_upgraded_under_a_running_worker_is_keyed_as_the_client_keys_it(
        tmp_path, cache_server, monkeypatch):
    tools = tmp_path / "tools"
    tools.mkdir()
    _tool(tools, "one")
    # The worker processes inherit this PATH: the client and the workers look the tool
    # up in the same folder, as on one machine.
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    name = tmp_path.name
    (cache_server.root / name / "ac").mkdir(parents=True)
    (cache_server.root / name / "cas").mkdir()
    url = f"{cache_server.url}/{name}"
    ws = Workspace(tmp_path / "ws", tmp_path / "cache")
    ws.write("p/BUILD.toml", "[t]\nrule = 'command'\ncmd = 'mytool > $(OUT)'\n"
                             "outs = ['out.txt']\n")
    with distributed.LocalCluster(processes=True, n_workers=1, threads_per_worker=1,
                                  host="127.0.0.1", dashboard_address=":0") as cluster:
        address = "dask://" + cluster.scheduler_address.removeprefix("tcp://")
        options = dict(remote_cache=url, remote_executor=address, strategy=["*=remote"])
        first = ws.build("//p:t", **options)
        assert first.ok, first.error + first.log
        assert first.remote_execution["remote_actions"] == 1
        assert first.output("//p:t").read_text() == "one\n"
        _tool(tools, "two")  # upgraded in place while the worker runs
        second = ws.build("//p:t", **options)
        assert second.ok, second.error + second.log
        assert second.remote_execution["remote_actions"] == 1, second.remote_execution
        assert second.output("//p:t").read_text() == "two\n"
