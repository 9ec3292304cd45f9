"""Remote execution against a real ``dask scheduler`` and ``dask worker`` processes,
started as an operator would (random ports on 127.0.0.1): the ``qbuild`` command with
the real ONNX rules gives the bytes a local build gives and logs the worker of each
action; a worker whose copy of a rule's code differs refuses, naming the difference."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import toy_rules

from conftest import ENGINE_TESTS, HERE
from qbuild.testing import Workspace

REPO = Path(__file__).resolve().parents[2]

BUILD = """
[fp32]
rule = "onnx_model"
src = "mnist.onnx"

[int8]
rule = "quantize_dynamic"
model = ":fp32"
"""


def _workspace(tmp_path: Path, name: str) -> Workspace:
    ws = Workspace(tmp_path / name, tmp_path / f"cache-{name}")
    ws.copy(REPO / "testdata/models/mnist.onnx", "m/mnist.onnx")
    ws.write("m/BUILD.toml", BUILD)
    return ws


def _prefix(server, name: str) -> str:
    (server.root / name / "ac").mkdir(parents=True)
    (server.root / name / "cas").mkdir()
    return f"{server.url}/{name}"


def test_cli_on_real_scheduler_and_workers(tmp_path, cache_server, dask_processes):
    for name, gpu in (("w1", " GPU=1"), ("w2", "")):
        dask_processes.worker(name, [ENGINE_TESTS, HERE], "--resources",
                              f"CPU=2 MEMORY=1000{gpu}")
    dask_processes.wait_for_workers(2)
    here = _workspace(tmp_path, "here")
    local = here.build("//m:int8")
    assert local.ok, local.error
    there = _workspace(tmp_path, "there")
    events = tmp_path / "events.jsonl"
    url = _prefix(cache_server, tmp_path.name)
    remote = there.cli("build", "//m:int8", "--remote_cache", url,
                       f"--remote_executor=dask://{dask_processes.address}",
                       f"--event_log={events}")
    assert remote.code == 0, remote.stderr
    paths = remote.stdout.split()
    assert [there.root / p for p in paths] == [
        there.root / p.relative_to(here.root) for p in local.outputs("//m:int8")]
    for path in local.outputs("//m:int8"):
        assert path.read_bytes() == (there.root / path.relative_to(here.root)).read_bytes()
    ran = [json.loads(x) for x in events.read_text().splitlines()]
    ran = {e["label"]: e for e in ran if e.get("status") == "ran"}
    assert set(ran) == {"//m:fp32", "//m:int8"}
    assert all(e["worker"].startswith("tcp://127.0.0.1:") for e in ran.values())
    finished = json.loads(events.read_text().splitlines()[-1])
    assert finished["remote_execution"]["remote_actions"] == 2
    assert "Dask workers" in remote.stderr and "dashboard http://" in remote.stderr
    # Declared cores and memory become Dask resources: 4 cores asked, 2 granted (the
    # largest worker's CPU); more memory than any worker offers fails at once.
    spans = Workspace(tmp_path / "spans", tmp_path / "cache-spans")
    spans.register(toy_rules)
    spans.write("s/BUILD.toml", '[wide]\nrule = "span"\ncores = 4\nseconds = 0.1\n\n'
                '[big]\nrule = "span"\nmib = 5000\nseconds = 0.1\n\n'
                '[gpu]\nrule = "span"\ngpus = 1\nseconds = 0.1\n\n'
                '[gpus]\nrule = "span"\ngpus = 2\nseconds = 0.1\n')
    settings = {"remote_cache": _prefix(cache_server, "spans"), "strategy": ["*=remote"],
                "remote_executor": f"dask://{dask_processes.address}"}
    wide = spans.build("//s:wide", **settings)
    assert wide.ok, wide.error
    assert wide.output("//s:wide").read_text().split()[0] == "2"
    big = spans.build("//s:big", **settings)
    assert not big.ok and "needs 5000 MiB" in big.error and "MEMORY=1000" in big.error
    # Accelerators (GPU) place an action on the one worker that offers them.
    gpu = spans.build("//s:gpu", **settings)
    assert gpu.ok, gpu.error
    assert gpu.remote_execution is not None
    assert gpu.remote_execution["workers"] == {dask_processes.worker_address("w1"): 1}
    gpus = spans.build("//s:gpus", **settings)
    assert not gpus.ok and "needs GPU=2" in gpus.error and "GPU=1" in gpus.error
    # The no-op fast path answers without contacting the scheduler.
    again = there.cli("build", "//m:int8", "--remote_cache", url,
                      "--remote_executor=dask://127.0.0.1:9")
    assert again.code == 0, again.stderr


def test_a_worker_with_other_rule_code_refuses(tmp_path, cache_server, dask_processes):
    modified = tmp_path / "modified"
    modified.mkdir()
    text = (ENGINE_TESTS / "toy_rules.py").read_text()
    (modified / "toy_rules.py").write_text(text + "\n# a local edit on the worker\n")
    shutil.copy(HERE / "dist_rules.py", modified / "dist_rules.py")
    dask_processes.worker("stale", [modified])
    dask_processes.wait_for_workers(1)
    ws = Workspace(tmp_path / "ws", tmp_path / "cache")
    ws.register(toy_rules)
    ws.write("p/a.txt", "alpha\n")
    ws.write("p/BUILD.toml", '[one]\nrule = "concat"\nsrcs = ["a.txt"]\n')
    url = _prefix(cache_server, tmp_path.name)
    outcome = ws.build("//p:one", remote_cache=url, strategy=["*=remote"],
                       remote_executor=f"dask://{dask_processes.address}")
    assert not outcome.ok and outcome.exit_code == 1
    assert "refused" in outcome.error and "rule code toy_rules differs" in outcome.error
    assert outcome.remote_execution["remote_actions"] == 0
    assert not list((cache_server.root / tmp_path.name / "ac").iterdir())  # nothing cached
    fallback = ws.build("//p:one", remote_cache=url, remote_local_fallback=True,
                        strategy=["*=remote"],
                        remote_executor=f"dask://{dask_processes.address}")
    assert fallback.ok and fallback.remote_execution["local_actions"] == 1


def test_scheduler_lost_mid_build_fails_cleanly(tmp_path, cache_server, dask_processes):
    # The scheduler dies while a worker runs the action: the build ends with one line
    # naming the scheduler (exit 1) instead of hanging, and the cache server holds no
    # entry for the unfinished action.
    import os
    import signal
    import threading
    import time

    import dist_rules

    dask_processes.worker("w", [ENGINE_TESTS, HERE])
    dask_processes.wait_for_workers(1)
    markers = tmp_path / "markers"
    markers.mkdir()
    ws = Workspace(tmp_path / "ws", tmp_path / "cache")
    ws.register(dist_rules)
    ws.write("p/BUILD.toml", f'[slow]\nrule = "block"\nmarkers = "{markers}"\n')
    url = _prefix(cache_server, tmp_path.name)
    result: dict = {}

    def build() -> None:
        result["outcome"] = ws.build("//p:slow", remote_cache=url, strategy=["*=remote"],
                                     remote_executor=f"dask://{dask_processes.address}")

    thread = threading.Thread(target=build)
    thread.start()
    deadline = time.monotonic() + 60
    while not (markers / "started").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert (markers / "started").exists(), "the action never started on the worker"
    os.killpg(dask_processes.procs[0].pid, signal.SIGKILL)  # the scheduler
    thread.join(120)
    assert not thread.is_alive(), "the build hung after the scheduler was lost"
    outcome = result["outcome"]
    assert not outcome.ok and outcome.exit_code == 1
    assert "scheduler" in outcome.error and "lost" in outcome.error
    assert "Traceback" not in outcome.error
    assert not list((cache_server.root / tmp_path.name / "ac").iterdir())
