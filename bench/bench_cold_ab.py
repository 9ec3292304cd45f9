"""A/B of the cold fixed cost per trivial action between installed qbuild versions (one
virtual environment each), as ``bench_engine.py`` defines it: a cold build of N
``filegroup`` targets (empty cache, no ``qbuild-out``) minus the full-path no-op build
(``--explain``) of the same workspace, divided by N. Rounds alternate the sides (A, B,
A, B, ...) so that load from other jobs hits both alike; wall-clock and CPU time (user +
system of qbuild and what it waited for, from ``wait4``) are both printed, with the load
average around each round.

    python bench/bench_cold_ab.py --side main=/venvs/main --side new=/venvs/new \
        [--targets 10000] [--rounds 3] [--noops 3] [--jobs N]

Each side gets its own workspace (action keys include the engine's code).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_ab_venvs import run  # noqa: E402
from bench_engine import generate_trivial  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--side", action="append", required=True, help="NAME=VENV")
    parser.add_argument("--targets", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--noops", type=int, default=3)
    parser.add_argument("--jobs", type=int, help="-j (default: the workspace's)")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="qbuild-cold-ab-"))
    sides = []
    try:
        for item in args.side:
            name, _, venv = item.partition("=")
            root = base / f"ws-{name}"
            generate_trivial(root, args.targets)
            sides.append((name, Path(venv), root))
        jobs = ["-j", str(args.jobs)] if args.jobs else []
        per_action: dict[str, list[tuple[float, float]]] = {name: [] for name, *_ in sides}
        print(f"{args.targets} filegroups, {args.rounds} alternated rounds, "
              f"{os.cpu_count()} cores")
        for round_ in range(args.rounds):
            for name, venv, root in sides:
                load = os.getloadavg()[0]
                shutil.rmtree(root / ".cache", ignore_errors=True)
                shutil.rmtree(root / "qbuild-out", ignore_errors=True)
                cold = run(venv, root, "build", *jobs, "//...")
                noop = [run(venv, root, "build", "--explain", *jobs, "//...")
                        for _ in range(args.noops)]
                noop_wall = statistics.median(r[0] for r in noop)
                noop_cpu = statistics.median(r[1] for r in noop)
                wall = (cold[0] - noop_wall) / args.targets * 1000
                cpu = (cold[1] - noop_cpu) / args.targets * 1000
                per_action[name].append((wall, cpu))
                print(f"round {round_ + 1} {name}: cold {cold[0]:.2f} s ({cold[1]:.2f} s CPU), "
                      f"no-op {noop_wall:.2f} s ({noop_cpu:.2f} s CPU): per action "
                      f"{wall:.2f} ms ({cpu:.2f} ms CPU); load {load:.1f}–"
                      f"{os.getloadavg()[0]:.1f}", flush=True)
        print("\n| side | per trivial action, wall (median) | CPU (median) | rounds (wall) |")
        print("|---|---|---|---|")
        for name, values in per_action.items():
            print(f"| {name} | {statistics.median(w for w, _ in values):.2f} ms | "
                  f"{statistics.median(c for _, c in values):.2f} ms | "
                  f"{', '.join(f'{w:.2f}' for w, _ in values)} |")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
