"""Benchmark of the engine: no-op, cold and warm builds of generated workspaces.

Generates workspaces of 20 and 1,000 targets (half a chain, half a fan-out from one
target that reads a 100 MB source file, spread over 10 packages), then measures with the
real ``qbuild`` command in subprocesses:

- cold build (empty cache), warm build (empty qbuild-out, full cache), no-op build on the
  fast path and on the full path (``--explain``), a build after editing one source read
  by one target;
- the cold fixed cost per trivial action: a cold build of N ``filegroup`` targets (no
  process started per action) minus its full-path no-op build, divided by N;
- bytes hashed (from the JSON event log) and peak RSS of the qbuild process (wait4);
- ``qbuild --version``.

Run: ``python bench/bench_engine.py [--runs 7]``. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PACKAGES = 10
# Measured as users run qbuild: with the bytecode cache (a PYTHONDONTWRITEBYTECODE left
# in the caller's environment would recompile every module on every run, ≈ 0.1–0.3 s).
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def generate(root: Path, targets: int) -> None:
    root.mkdir(parents=True)
    (root / "qbuild.toml").write_text(f'[settings]\ncache_dir = "{root / ".cache"}"\n')
    src = root / "data"
    src.mkdir()
    with open(src / "big.bin", "wb") as handle:
        block = os.urandom(1 << 20)
        for _ in range(100):
            handle.write(block)
    (src / "BUILD.toml").write_text(
        '[big]\nrule = "command"\nsrcs = ["big.bin"]\nouts = ["size.txt"]\n'
        'cmd = "wc -c < $(SRCS) > $(OUT)"\n')
    per_package: dict[int, list[str]] = {i: [] for i in range(PACKAGES)}
    chain = (targets - 1) // 2
    fan = targets - 1 - chain
    for i in range(chain):
        dep = "//data:big" if i == 0 else f"//p{(i - 1) % PACKAGES}:chain{i - 1}"
        per_package[i % PACKAGES].append(
            f'[chain{i}]\nrule = "command"\nsrcs = ["{dep}"]\nouts = ["c.txt"]\n'
            f'cmd = "cat $(SRCS) > $(OUT); echo {i} >> $(OUT)"\n')
    for i in range(fan):
        per_package[i % PACKAGES].append(
            f'[fan{i}]\nrule = "command"\nsrcs = ["//data:big"]\nouts = ["f.txt"]\n'
            f'cmd = "cat $(SRCS) > $(OUT); echo {i} >> $(OUT)"\n')
    per_package[0].append('[leaf]\nrule = "command"\nsrcs = ["leaf.txt"]\nouts = ["l.txt"]\n'
                          'cmd = "cat $(SRCS) > $(OUT)"\n')
    for i, blocks in per_package.items():
        (root / f"p{i}").mkdir()
        (root / f"p{i}" / "BUILD.toml").write_text("\n".join(blocks))
    (root / "p0" / "leaf.txt").write_text("leaf\n")


def generate_trivial(root: Path, targets: int) -> None:
    """``targets`` filegroups of one small file each, 10 packages."""
    root.mkdir(parents=True)
    (root / "qbuild.toml").write_text(f'[settings]\ncache_dir = "{root / ".cache"}"\n')
    for p in range(PACKAGES):
        package = root / f"t{p}"
        package.mkdir()
        blocks = []
        for i in range(p, targets, PACKAGES):
            (package / f"f{i}.txt").write_text(f"{i}\n")
            blocks.append(f'[g{i}]\nrule = "filegroup"\nsrcs = ["f{i}.txt"]\n')
        (package / "BUILD.toml").write_text("\n".join(blocks))


CPU: list[float] = []  # CPU seconds (user + system) of each run, in order


def run(root: Path, *args: str, event_log: bool = True) -> tuple[float, int, dict]:
    """Run qbuild; return (seconds, peak RSS bytes, build_finished event). Its CPU time
    (steadier than wall-clock time on a shared machine) is appended to ``CPU``."""
    log = root / "events.jsonl"
    argv = [sys.executable, "-m", "qbuild", *args]
    event_log = event_log and bool(args) and args[0] == "build"
    if event_log:
        argv += ["--event_log", str(log)]
    start = time.perf_counter()
    # stderr to a file: a pipe nobody reads while waiting fills up at 10,000 targets.
    with tempfile.TemporaryFile() as errors:
        proc = subprocess.Popen(argv, cwd=root, stdout=subprocess.DEVNULL, stderr=errors,
                                env=ENV)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - start
        CPU.append(usage.ru_utime + usage.ru_stime)
        errors.seek(0)
        err = errors.read().decode(errors="replace")
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"qbuild {' '.join(args)} failed:\n{err}")
    finished = {}
    if event_log:
        lines = log.read_text().splitlines()
        finished = json.loads(lines[-1])
    return seconds, usage.ru_maxrss * 1024, finished


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--sizes", default="20,1000")
    args = parser.parse_args()
    rows = []
    loads = [os.getloadavg()[0]]
    subprocess.run([sys.executable, "-m", "qbuild", "--version"], env=ENV,
                   stdout=subprocess.DEVNULL, check=True)  # bytecode written once
    base = Path(tempfile.mkdtemp(prefix="qbuild-bench-"))
    try:
        for size in (int(s) for s in args.sizes.split(",")):
            root = base / f"ws{size}"
            generate(root, size)
            cold = []
            for _ in range(max(1, args.runs // 3)):
                shutil.rmtree(root / ".cache", ignore_errors=True)
                shutil.rmtree(root / "qbuild-out", ignore_errors=True)
                cold.append(run(root, "build", "//...")[0])
            warm = []
            for _ in range(max(1, args.runs // 3)):
                shutil.rmtree(root / "qbuild-out", ignore_errors=True)
                warm.append(run(root, "build", "//...")[0])
            run(root, "build", "//...", event_log=False)
            fast = [run(root, "build", "//...", event_log=False) for _ in range(args.runs)]
            # With an event log the fast path is off: the full no-op path (analysis,
            # stat memo, action-cache lookups), which also reports bytes hashed.
            noop = [run(root, "build", "//...") for _ in range(args.runs)]
            explain, explain_cpu = [], []
            for _ in range(args.runs):
                explain.append(run(root, "build", "--explain", "//...", event_log=False))
                explain_cpu.append(CPU[-1])
            edited, edited_cpu = [], []
            for k in range(args.runs):
                (root / "p0" / "leaf.txt").write_text(f"leaf {k}\n")
                edited.append(run(root, "build", "//...", event_log=False)[0])
                edited_cpu.append(CPU[-1])
            rows.append({
                "targets": size,
                "cold_s": statistics.median(cold),
                "warm_s": statistics.median(warm),
                "fast_s": statistics.median(r[0] for r in fast),
                "fast_rss_mb": max(r[1] for r in fast) / 2**20,
                "noop_s": statistics.median(r[0] for r in noop),
                "noop_bytes_hashed": max(r[2]["bytes_hashed"] for r in noop),
                "noop_actions_run": max(r[2]["actions_run"] for r in noop),
                "noop_peak_rss_mb": max(r[1] for r in noop) / 2**20,
                "explain_s": statistics.median(r[0] for r in explain),
                "edited_s": statistics.median(edited),
                "explain_cpu": statistics.median(explain_cpu),
                "edited_cpu": statistics.median(edited_cpu),
            })
            trivial = base / f"trivial{size}"
            generate_trivial(trivial, size)
            cold_trivial = []
            for _ in range(max(1, args.runs // 3)):
                shutil.rmtree(trivial / ".cache", ignore_errors=True)
                shutil.rmtree(trivial / "qbuild-out", ignore_errors=True)
                cold_trivial.append(run(trivial, "build", "//...", event_log=False)[0])
            full_trivial = [run(trivial, "build", "--explain", "//...", event_log=False)[0]
                            for _ in range(args.runs)]
            loads.append(os.getloadavg()[0])
            rows[-1]["per_action_ms"] = (statistics.median(cold_trivial)
                                         - statistics.median(full_trivial)) / size * 1000
        version = [run(base, "--version")[0] for _ in range(args.runs)]
        bare = []
        for _ in range(args.runs):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", "pass"], check=True, env=ENV)
            bare.append(time.perf_counter() - start)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}, {platform.system()} {platform.release()}; "
          f"medians of {args.runs} runs (cold/warm: {max(1, args.runs // 3)}); "
          f"load average {min(loads):.1f}–{max(loads):.1f}\n")
    print("| targets | cold build | warm build (cache, no outputs) | no-op build (fast path) "
          "| no-op build (full path, `--explain`) | one source edited | cold cost per trivial "
          "action | no-op bytes hashed | no-op actions run | no-op peak RSS (fast / full) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['targets']} | {r['cold_s']:.2f} s | {r['warm_s']:.2f} s | "
              f"{r['fast_s'] * 1000:.0f} ms | {r['explain_s'] * 1000:.0f} ms | "
              f"{r['edited_s'] * 1000:.0f} ms | {r['per_action_ms']:.2f} ms | "
              f"{r['noop_bytes_hashed']} | {r['noop_actions_run']} | "
              f"{r['fast_rss_mb']:.1f} / {r['noop_peak_rss_mb']:.1f} MB |")
    print("\nCPU time (user + system) of the same runs, steadier than wall-clock time on a "
          "shared machine:\n")
    print("| targets | no-op (full path, `--explain`) | one source edited |")
    print("|---|---|---|")
    for r in rows:
        print(f"| {r['targets']} | {r['explain_cpu'] * 1000:.0f} ms | "
              f"{r['edited_cpu'] * 1000:.0f} ms |")
    print(f"\nInterpreter alone (`python -c pass`): {statistics.median(bare) * 1000:.0f} ms")
    print(f"\n`qbuild --version`: {statistics.median(version) * 1000:.0f} ms")


if __name__ == "__main__":
    main()
