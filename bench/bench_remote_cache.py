"""Benchmark of the shared remote cache on the YOLO example (``//examples/yolo:yolo_int8``).

Every build runs the real ``qbuild`` command in a fresh ``git clone`` of this repository
with an empty local cache (``QBUILD_CACHE_DIR``), against a cache server on 127.0.0.1
(nginx if installed, else wsgidav; ``--kind`` to choose):

- cold: no remote cache (the baseline);
- cold + upload: an empty server, uploading every result (upload overhead, goal <= 1.1x);
- warm remote: a server filled by an earlier build (goal <= 0.15x cold), bytes downloaded
  against the bytes of every output in the graph;
- intermediate-only change: ``yolo_int8_q`` keeps two Convs fewer in float; only it and
  ``yolo_int8`` run, and only the inputs they read are downloaded (build without the bytes).

Cold and cold + upload runs alternate so that load from other processes hits both alike.
Run: ``python bench/bench_remote_cache.py [--runs 3] [--kind nginx]``. Prints a markdown
table (medians).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples" / "ci"))

from cache_server import start  # noqa: E402

TARGET = "//examples/yolo:yolo_int8"
CHANGE = ('nodes_to_exclude = ["upto:729"]', 'nodes_to_exclude = ["upto:721"]')


class Bench:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.count = 0

    def clone(self) -> Path:
        self.count += 1
        dest = self.base / f"clone{self.count}"
        subprocess.run(["git", "clone", "--quiet", "--local", str(REPO), str(dest)],
                       check=True)
        return dest

    def build(self, machine: Path, *flags: str) -> dict:
        log = machine / "events.jsonl"
        env = dict(os.environ, QBUILD_CACHE_DIR=str(machine / ".cache"))
        env.pop("QBUILD_REMOTE_CACHE", None)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "qbuild", "build", TARGET,
                               f"--event_log={log}", *flags], cwd=machine, env=env,
                              capture_output=True, text=True)
        seconds = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        # CPU of qbuild and its worker processes: far less disturbed than wall-clock time
        # by other jobs on a shared machine.
        cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
        if proc.returncode != 0:
            raise SystemExit(f"build failed:\n{proc.stderr}")
        events = [json.loads(line) for line in log.read_text().splitlines()]
        finished = events[-1]
        remote = finished.get("remote", {})
        return {"seconds": seconds, "cpu": cpu, "ran": finished["actions_run"],
                "down": remote.get("bytes_downloaded", 0),
                "up": remote.get("bytes_uploaded", 0),
                "wait": remote.get("upload_wait_seconds", 0.0),
                "hits": finished.get("remote_cache_hits", 0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--kind", choices=["auto", "nginx", "wsgidav"], default="auto")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="qbuild-bench-remote-") as tmp:
        bench = Bench(Path(tmp))
        cold, upload, warm, change = [], [], [], []
        graph_bytes = 0
        kind = ""
        for run in range(args.runs):
            server = start(Path(tmp) / f"server{run}", args.kind)
            kind = server.kind
            try:
                cold.append(bench.build(bench.clone()))
                upload.append(bench.build(bench.clone(), f"--remote_cache={server.url}"))
                graph_bytes = sum(p.stat().st_size for p in (server.root / "cas").iterdir())
                warm.append(bench.build(bench.clone(), f"--remote_cache={server.url}",
                                        "--noremote_upload_local_results"))
                changed = bench.clone()
                build_file = changed / "examples/yolo/BUILD.toml"
                build_file.write_text(build_file.read_text().replace(*CHANGE))
                change.append(bench.build(changed, f"--remote_cache={server.url}",
                                          "--noremote_upload_local_results"))
            finally:
                server.stop()
            upload[-1]["ratio"] = upload[-1]["seconds"] / cold[-1]["seconds"]
            upload[-1]["cpu_ratio"] = upload[-1]["cpu"] / cold[-1]["cpu"]
            print(f"run {run + 1}: cold {cold[-1]['seconds']:.1f}s, upload "
                  f"{upload[-1]['seconds']:.1f}s, warm {warm[-1]['seconds']:.2f}s, change "
                  f"{change[-1]['seconds']:.1f}s", file=sys.stderr)

    def med(rows: list[dict], key: str) -> float:
        return statistics.median(r[key] for r in rows)

    c = med(cold, "seconds")
    versions = (f"Python {platform.python_version()}, onnxruntime "
                f"{metadata.version('onnxruntime')}, server {kind}, "
                f"{os.cpu_count()} cores, {platform.machine()}")
    print(f"{TARGET}, medians of {args.runs} runs ({versions}); every build in a fresh "
          "clone with an empty local cache\n")
    cc = med(cold, "cpu")
    print("| build | time | vs cold | CPU time | vs cold | actions run | remote hits | "
          "downloaded | uploaded |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, rows in (("cold, no remote cache", cold), ("cold, uploading to an empty "
                       "server", upload), ("warm remote cache", warm),
                       ("intermediate-only change, warm remote", change)):
        t = med(rows, "seconds")
        u = med(rows, "cpu")
        print(f"| {name} | {t:.2f} s | {t / c:.2f}x | {u:.2f} s | {u / cc:.2f}x "
              f"| {rows[0]['ran']} | {rows[0]['hits']} "
              f"| {med(rows, 'down') / 1e6:.1f} MB | {med(rows, 'up') / 1e6:.1f} MB |")
    print(f"\nAll blobs of the graph on the server: {graph_bytes / 1e6:.1f} MB. Upload "
          f"overhead, median of the paired (same run) ratios: {med(upload, 'ratio'):.2f}x "
          f"wall-clock, {med(upload, 'cpu_ratio'):.2f}x CPU; "
          f"the build's wait for its last uploads after its last action: "
          f"{med(upload, 'wait'):.2f} s.")


if __name__ == "__main__":
    main()
