"""Benchmark of remote execution on Dask (``--remote_executor``) against local execution.

On 127.0.0.1: a wsgidav cache server and a ``distributed.LocalCluster`` of worker
processes (one thread each). Every build starts with an empty local cache and an empty
server prefix (cold), runs in-process through ``qbuild.testing.Workspace.build``:

- overhead: ``--actions`` independent tiny actions (the test suite's ``concat`` rule: a
  few bytes in, a few out), one at a time (``-j 1``): local in-thread execution against
  remote execution on the cluster (``--strategy '*=remote'``); the difference divided by
  the number of actions is the per-action cost of going through the scheduler, the
  worker and the cache server (goal <= 50 ms);
- sweep: 8 quantization variants of MobileNetV2-128-0.5 (2 calibration methods x per-
  channel on/off x QDQ/QOperator), with their shared pre-processing, image dataset and
  calibrations (14 actions): local ``-j 2`` against 2 workers.

Local and remote runs alternate, so load from other processes hits both alike.
Run: ``python bench/bench_distributed.py [--runs 3] [--actions 40]``. Prints a markdown
table (medians) and the machine's description.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "engine"))

import toy_rules  # noqa: E402
from remote_servers import Wsgidav  # noqa: E402

from qbuild.testing import Workspace  # noqa: E402

SWEEP = """
[fp32]
rule = "onnx_model"
src = "mobilenet.onnx"

[pre]
rule = "quant_preprocess"
model = ":fp32"

[images]
rule = "image_dataset"
images = ["images/*"]
input = "input_1:0"
size = [128, 128]
scale = 0.00784313725490196
mean = [1.0]
"""


def sweep_build() -> tuple[str, list[str]]:
    text, targets = SWEEP, []
    for method in ("minmax", "percentile"):
        text += (f'\n[calib_{method}]\nrule = "calibrate"\nmodel = ":pre"\n'
                 f'dataset = ":images"\nmethod = "{method}"\n')
        for per_channel in ("true", "false"):
            for fmt in ("qdq", "qoperator"):
                name = f"int8_{method}_{per_channel}_{fmt}"
                text += (f'\n[{name}]\nrule = "quantize"\nmodel = ":pre"\n'
                         f'calibration = ":calib_{method}"\nper_channel = {per_channel}\n'
                         f'format = "{fmt}"\n')
                targets.append(f"//m:{name}")
    return text, targets


def tree_cpu() -> float:
    """CPU seconds used so far by this process and every live descendant (the cluster's
    scheduler, nannies and workers, the cache server): steadier than wall time on a
    shared machine."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for proc in [me, *me.children(recursive=True)]:
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


class Bench:
    def __init__(self, base: Path, server: Wsgidav, address: str) -> None:
        self.base, self.server, self.address = base, server, address
        self.count = 0
        self.cpu: list[float] = []  # CPU seconds of each run, every process included

    def fresh(self, setup) -> tuple[Workspace, str]:
        self.count += 1
        name = f"run{self.count}"
        ws = Workspace(self.base / name, self.base / f"cache-{name}")
        ws.register(toy_rules)
        setup(ws)
        (self.server.root / name / "ac").mkdir(parents=True)
        (self.server.root / name / "cas").mkdir()
        return ws, f"{self.server.url}/{name}"

    def run(self, setup, targets: list[str], jobs: int, remote: bool) -> float:
        ws, url = self.fresh(setup)
        kwargs = {}
        if remote:
            kwargs = {"remote_cache": url, "remote_executor": self.address,
                      "strategy": ["*=remote"]}
        cpu = tree_cpu()
        started = time.perf_counter()
        outcome = ws.build(*targets, jobs=jobs, **kwargs)
        seconds = time.perf_counter() - started
        self.cpu.append(tree_cpu() - cpu)
        assert outcome.ok, outcome.error + outcome.log
        if remote:
            assert outcome.remote_execution["local_actions"] == 0
        return seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--actions", type=int, default=40)
    parser.add_argument("--skip-sweep", action="store_true")
    args = parser.parse_args()
    import distributed

    with tempfile.TemporaryDirectory(prefix="qbuild-bench-dist-") as tmp:
        base = Path(tmp)
        server = Wsgidav(base / "dav")
        cluster = distributed.LocalCluster(processes=True, n_workers=2, threads_per_worker=1,
                                           host="127.0.0.1", dashboard_address=":0")
        address = "dask://" + cluster.scheduler_address.removeprefix("tcp://")
        bench = Bench(base / "ws", server, address)
        try:
            def tiny(ws: Workspace) -> None:
                ws.write("p/a.txt", "alpha\n")
                ws.write("p/BUILD.toml", "".join(
                    f'[t{i}]\nrule = "concat"\nsrcs = ["a.txt"]\nsep = "{i}"\nrepeat = 2\n\n'
                    for i in range(args.actions)))

            tiny_targets = [f"//p:t{i}" for i in range(args.actions)]
            bench.run(tiny, tiny_targets[:2], 1, True)  # warm the workers' imports
            local, remote, local_cpu, remote_cpu = [], [], [], []
            for _ in range(args.runs):
                local.append(bench.run(tiny, tiny_targets, 1, False))
                local_cpu.append(bench.cpu[-1])
                remote.append(bench.run(tiny, tiny_targets, 1, True))
                remote_cpu.append(bench.cpu[-1])
            rows = [("overhead", f"{args.actions} tiny actions, -j 1", local, remote),
                    ("overhead, CPU s (all processes)", f"{args.actions} tiny actions",
                     local_cpu, remote_cpu)]
            if not args.skip_sweep:
                bench.cpu.clear()
                text, targets = sweep_build()

                def sweep(ws: Workspace) -> None:
                    ws.copy(REPO / "testdata/models/mobilenet_v2_128_0.5.onnx",
                            "m/mobilenet.onnx")
                    for image in sorted((REPO / "testdata/images").glob("*.jpg")):
                        ws.copy(image, f"m/images/{image.name}")
                    ws.write("m/BUILD.toml", text)

                local_s, remote_s = [], []
                for _ in range(args.runs):
                    local_s.append(bench.run(sweep, targets, 2, False))
                    remote_s.append(bench.run(sweep, targets, 8, True))
                rows.append(("sweep", "8 quantize variants (14 actions): local -j 2 vs "
                             "2 workers", local_s, remote_s))
        finally:
            cluster.close()
            server.stop()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, load "
          f"{os.getloadavg()[0]:.1f}; Python {platform.python_version()}, distributed "
          f"{metadata.version('distributed')}, onnxruntime {metadata.version('onnxruntime')}")
    print("| case | what | local (median s) | remote (median s) | remote / local | "
          "per action |")
    print("|---|---|---|---|---|---|")
    for name, what, here, there in rows:
        lm, rm = statistics.median(here), statistics.median(there)
        per = (f"{(rm - lm) / args.actions * 1000:+.1f} ms" if name.startswith("overhead")
               else "")
        print(f"| {name} | {what} | {lm:.2f} | {rm:.2f} | {rm / lm:.2f}x | {per} |")
        print(f"<!-- {name}: local {[round(x, 2) for x in here]}, remote "
              f"{[round(x, 2) for x in there]} -->")


if __name__ == "__main__":
    main()
