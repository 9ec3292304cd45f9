"""Rebuild after changing only an auto_quantize target's bar: wall and CPU time of the
whole `qbuild build` command, and which actions ran.

Run from the repository root after the target has been built once (its trials cached):

    python bench/bench_auto_rebuild.py [--runs 6] [--target //examples/yolo:yolo_auto]

Each run rewrites the `bar = { ... }` line of the target's BUILD.toml with a bar no
earlier run has cached (``min_f1_lower`` stepping down; every third run an unreachable
``min_f1``, so the choice changes and the model is copied again), builds, and reads the
event log: only the target itself may run (its `Select`, and `Copy` when the choice
changed; tests/onnx_eval/test_auto_quantize.py checks the actions one by one). The
BUILD.toml is restored at the end. Prints the median and range of wall and CPU time
(user + system of the command and its children) and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run(target: str, runs: int) -> dict:
    package, name = target[2:].split(":")
    build = ROOT / package / "BUILD.toml"
    original = build.read_text()
    section = re.search(rf"^\[{re.escape(name)}\]\n(.*?)(?=^\[|\Z)", original, re.M | re.S)
    if section is None or "bar = {" not in section.group(1):
        raise SystemExit(f"{build}: no [{name}] table with a bar line")
    bar_line = re.search(r"^bar = \{.*\}$", section.group(1), re.M).group(0)
    rows = []
    nonce = (time.time_ns() // 1000) % 10**6 * 1e-10  # values no earlier run has cached
    try:
        for i in range(runs):
            bar = (f"bar = {{ min_f1 = {2.0 + 0.001 * i + nonce:.10f} }}" if i % 3 == 2 else
                   f"bar = {{ min_f1 = 0.95, min_f1_lower = "
                   f"{0.95 - 0.001 * (i + 1) - nonce:.10f} }}")
            head, body = original[:section.start(1)], section.group(1)
            build.write_text(head + body.replace(bar_line, bar) + original[section.end(1):])
            with tempfile.NamedTemporaryFile(suffix=".jsonl") as log:
                cpu0, t0 = _children_cpu(), time.perf_counter()
                proc = subprocess.run([sys.executable, "-m", "qbuild", "build", "-q",
                                       "--event_log", log.name, target], cwd=ROOT,
                                      capture_output=True, text=True)
                wall, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
                if proc.returncode:
                    raise SystemExit(proc.stderr[-2000:])
                events = [json.loads(line) for line in Path(log.name).read_text().splitlines()]
            ran = sorted(e["label"] for e in events
                         if e.get("event") == "action_finished" and e.get("status") == "ran")
            rows.append({"bar": bar, "wall_s": round(wall, 3), "cpu_s": round(cpu, 3),
                         "ran": ran, "load": os.getloadavg()[0]})
            print(json.dumps(rows[-1]), flush=True)
    finally:
        build.write_text(original)
    walls = [r["wall_s"] for r in rows]
    cpus = [r["cpu_s"] for r in rows]
    return {"runs": runs, "wall_median_s": statistics.median(walls),
            "wall_range_s": [min(walls), max(walls)], "cpu_median_s": statistics.median(cpus),
            "cpu_range_s": [min(cpus), max(cpus)],
            "load": [min(r["load"] for r in rows), max(r["load"] for r in rows)]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--target", default="//examples/yolo:yolo_auto")
    args = ap.parse_args()
    print(json.dumps(run(args.target, args.runs), indent=1))


if __name__ == "__main__":
    main()
