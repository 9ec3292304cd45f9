"""Fixtures for the distributed tests: a wsgidav cache server, a ``LocalCluster`` with
two worker processes, and a real ``dask scheduler`` with ``dask worker`` processes, all
on 127.0.0.1 and stopped at the end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ENGINE_TESTS = HERE.parent / "engine"
sys.path.insert(0, str(ENGINE_TESTS))  # toy_rules, remote_servers

from remote_servers import Wsgidav, free_port  # noqa: E402

distributed = pytest.importorskip("distributed")


@pytest.fixture(scope="module")
def cache_server(tmp_path_factory):
    server = Wsgidav(tmp_path_factory.mktemp("dav") / "root")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def local_cluster():
    cluster = distributed.LocalCluster(processes=True, n_workers=2, threads_per_worker=1,
                                       host="127.0.0.1", dashboard_address=":0")
    yield cluster
    cluster.close()


class DaskProcesses:
    """``dask scheduler`` and ``dask worker`` processes started like an operator would."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen] = []
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self._start("scheduler", ["scheduler", "--host", "127.0.0.1", "--port",
                                  str(self.port), "--dashboard-address", ":0"], os.environ)

    def _start(self, name: str, args: list[str], env) -> subprocess.Popen:
        log = open(self.log_dir / f"{name}-{len(self.procs)}.log", "wb")  # noqa: SIM115
        # ``python -m dask`` is the ``dask`` command, wherever pip put its script.
        proc = subprocess.Popen([sys.executable, "-m", "dask", *args],
                                stdout=log, stderr=subprocess.STDOUT, env=dict(env),
                                start_new_session=True)
        self.procs.append(proc)
        return proc

    def worker(self, name: str, pythonpath: list[Path], *extra: str) -> subprocess.Popen:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(p) for p in pythonpath] + [p for p in [env.get("PYTHONPATH")] if p])
        env["QBUILD_WORKER_CACHE_DIR"] = str(self.log_dir / f"cache-{name}")
        return self._start(name, ["worker", f"tcp://{self.address}", "--nthreads", "1",
                                  "--host", "127.0.0.1", "--no-dashboard", "--name", name,
                                  *extra],
                           env)

    def wait_for_workers(self, count: int, seconds: float = 60) -> None:
        with distributed.Client(f"tcp://{self.address}", timeout=seconds) as client:
            client.wait_for_workers(count, timeout=seconds)

    def worker_address(self, name: str) -> str:
        """The address of the worker started as ``name``."""
        with distributed.Client(f"tcp://{self.address}", timeout=30) as client:
            workers = client.scheduler_info(n_workers=-1)["workers"]
        return next(addr for addr, w in workers.items() if w.get("name") == name)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except OSError:
                    pass
        deadline = time.monotonic() + 10
        for proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.fixture
def dask_processes(tmp_path):
    procs = DaskProcesses(tmp_path)
    yield procs
    procs.stop()
