"""When the only worker able to run an action is lost, the build does not wait forever
(issue 24, defect 15): with ``--remote_local_fallback`` the action runs here, without it
the target fails with one line saying why. Real ``dask scheduler`` and ``dask worker``
processes; the worker offering the GPU runs without a nanny, so a killed one stays dead."""

from __future__ import annotations

import os
import signal
import threading
import time

import dist_rules
import pytest
from test_summary_last import summary_is_last

from conftest import ENGINE_TESTS, HERE
from qbuild.testing import Workspace


def _build_killing_the_gpu_worker(tmp_path, cache_server, dask_processes, fallback: bool):
    dask_processes.worker("gpu", [ENGINE_TESTS, HERE], "--no-nanny", "--resources", "GPU=1")
    dask_processes.worker("plain", [ENGINE_TESTS, HERE])
    dask_processes.wait_for_workers(2)
    markers = tmp_path / "markers"
    markers.mkdir()
    ws = Workspace(tmp_path / "ws", tmp_path / "cache")
    ws.register(dist_rules)
    ws.write("k/BUILD.toml", f'[slow]\nrule = "gpu_block"\nmarkers = "{markers}"\n')
    (cache_server.root / tmp_path.name / "ac").mkdir(parents=True)
    (cache_server.root / tmp_path.name / "cas").mkdir()
    outcome = {}

    def build() -> None:
        outcome["result"] = ws.build(
            "//k:slow", remote_cache=f"{cache_server.url}/{tmp_path.name}",
            strategy=["*=remote"], remote_executor=f"dask://{dask_processes.address}",
            remote_local_fallback=fallback)

    thread = threading.Thread(target=build, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60  # (a broken setup fails instead of hanging)
    while not (markers / "started").exists() or not (markers / "started").read_text():
        assert time.monotonic() < deadline and thread.is_alive(), outcome
        time.sleep(0.05)
    os.kill(int((markers / "started").read_text()), signal.SIGKILL)  # the GPU worker
    thread.join(120)  # a regression fails here instead of hanging the suite
    assert not thread.is_alive(), "the build still waits for a worker that is gone"
    return outcome["result"]


@pytest.mark.parametrize("fallback", [True, False])
def test_losing_the_only_able_worker_ends_the_wait(tmp_path, cache_server, dask_processes,
                                                   fallback):
    result = _build_killing_the_gpu_worker(tmp_path, cache_server, dask_processes, fallback)
    assert summary_is_last(result.log), result.log  # defect 19: nothing after it
    if fallback:
        assert result.ok, result.error + result.log
        assert result.output("//k:slow").read_text() == "done"
        assert result.remote_execution["local_actions"] == 1
    else:
        assert not result.ok and result.exit_code == 1
        assert "no Dask worker able to run it is left" in result.error
        assert "GPU=1" in result.error and "--remote_local_fallback" in result.error
