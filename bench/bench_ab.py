"""A/B benchmark of two qbuild source trees on the same generated workspaces, runs
interleaved (A, B, A, B, ...) so that load from other jobs on the machine hits both
alike, with CPU time (user + system of qbuild and every process it waited for, from
``wait4``) next to wall-clock time: on a shared machine CPU time is the steadier figure.

    python bench/bench_ab.py --before /tmp/qbuild-main --after . [--runs 5]

Each tree is a folder holding ``qbuild/`` and ``plugins/`` (e.g. ``git archive main
qbuild plugins | tar -x -C /tmp/qbuild-main``); it is put first on ``PYTHONPATH``.
Measured per size: cold build (empty cache), no-op build on the fast path and on the full
path (``--explain``), and a cold build of N trivial ``filegroup`` targets (no process
per action: the engine's own cost per action). Prints a markdown table of medians.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_engine import generate, generate_trivial  # noqa: E402


def run(tree: Path, root: Path, *args: str) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one ``qbuild`` command run with ``tree`` first."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree), str(tree / "plugins")])
    env.pop("QBUILD_CACHE_DIR", None)
    start = time.perf_counter()
    with tempfile.TemporaryFile() as errors:
        proc = subprocess.Popen([sys.executable, "-m", "qbuild", *args], cwd=root, env=env,
                                stdout=subprocess.DEVNULL, stderr=errors)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        if os.waitstatus_to_exitcode(status) != 0:
            errors.seek(0)
            raise SystemExit(f"qbuild {' '.join(args)} failed in {tree}:\n"
                             + errors.read().decode(errors="replace"))
    return wall, usage.ru_utime + usage.ru_stime


def fresh(root: Path) -> None:
    shutil.rmtree(root / ".cache", ignore_errors=True)
    shutil.rmtree(root / "qbuild-out", ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--after", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--sizes", default="20,1000")
    args = parser.parse_args()
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    figures: dict[tuple[int, str, str], list[tuple[float, float]]] = {}
    base = Path(tempfile.mkdtemp(prefix="qbuild-ab-"))
    try:
        for size in [int(s) for s in args.sizes.split(",")]:
            for name in trees:
                generate(base / f"w{size}-{name}", size)
                generate_trivial(base / f"t{size}-{name}", size)
            for _ in range(args.runs):
                for name, tree in trees.items():
                    work, trivial = base / f"w{size}-{name}", base / f"t{size}-{name}"
                    fresh(work)
                    figures.setdefault((size, "cold build", name), []).append(
                        run(tree, work, "build", "//..."))
                    figures.setdefault((size, "no-op (fast path)", name), []).append(
                        run(tree, work, "build", "//..."))
                    figures.setdefault((size, "no-op (full path)", name), []).append(
                        run(tree, work, "build", "--explain", "//..."))
                    fresh(trivial)
                    figures.setdefault((size, "cold trivial targets", name), []).append(
                        run(tree, trivial, "build", "//..."))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    load = os.getloadavg()[0]
    print(f"medians of {args.runs} interleaved runs; load average at the end {load:.1f} "
          f"on {os.cpu_count()} cores\n")
    print("| targets | build | before: wall | after: wall | before: CPU | after: CPU |")
    print("|---|---|---|---|---|---|")
    for (size, what, name), values in figures.items():
        if name != "before":
            continue
        after = figures[(size, what, "after")]

        def med(values: list[tuple[float, float]], i: int) -> float:
            return statistics.median(v[i] for v in values)

        print(f"| {size} | {what} | {med(values, 0):.3f} s | {med(after, 0):.3f} s | "
              f"{med(values, 1):.3f} s | {med(after, 1):.3f} s |")


if __name__ == "__main__":
    main()
