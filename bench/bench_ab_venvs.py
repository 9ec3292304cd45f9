"""A/B of two installed qbuild versions (one virtual environment each) on the
10,000-target workspace of ``bench_engine.py``: no-op on the full path (``--explain``),
one edited source (the incremental path), the no-op fast path and, at the end, the warm
build (cache populated, ``qbuild-out`` removed). Runs alternate (A, B, A, B, ...) so
that load from other jobs hits both alike; CPU time (user + system of qbuild and what
it waited for, from ``wait4``) is printed next to wall-clock time.

    python bench/bench_ab_venvs.py --side main=/venvs/main --side new=/venvs/new \
        [--targets 10000] [--rounds 3] [--warm 1] [--dir /tmp/ab]

Each side gets its own workspace (action keys include the engine's code, so one cache
cannot serve both), built cold once before the measured rounds; ``--dir`` keeps the
workspaces for another run (a side whose workspace exists is not built again).
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
from bench_engine import ENV, generate  # noqa: E402


def run(venv: Path, root: Path, *args: str) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds, last line of stderr) of one qbuild command."""
    start = time.perf_counter()
    with tempfile.TemporaryFile() as errors:
        proc = subprocess.Popen([str(venv / "bin" / "python"), "-m", "qbuild", *args],
                                cwd=root, env=ENV, stdout=subprocess.DEVNULL, stderr=errors)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        errors.seek(0)
        err = errors.read().decode(errors="replace").strip()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"qbuild {' '.join(args)} failed in {root}:\n{err[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime, err.splitlines()[-1] if err else ""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--side", action="append", required=True, help="NAME=VENV")
    parser.add_argument("--targets", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warm", type=int, default=1)
    parser.add_argument("--dir", type=Path)
    args = parser.parse_args()
    base = args.dir or Path(tempfile.mkdtemp(prefix="qbuild-ab-"))
    sides = []
    for item in args.side:
        name, _, venv = item.partition("=")
        root = base / f"ws-{name}"
        if not root.exists():
            generate(root, args.targets)
            wall, _cpu, _ = run(Path(venv), root, "build", "//...")
            print(f"{name}: cold build {wall:.1f} s", flush=True)
        run(Path(venv), root, "build", "//...")
        sides.append((name, Path(venv), root))
    times: dict[tuple[str, str], list[tuple[float, float]]] = {}
    loads = []
    for number in range(args.rounds):
        for name, venv, root in sides:
            loads.append(os.getloadavg()[0])
            wall, cpu, last = run(venv, root, "build", "--explain", "//...")
            times.setdefault(("no-op, full path (`--explain`)", name), []).append((wall, cpu))
            (root / "p0" / "leaf.txt").write_text(f"leaf {number} {time.time()}\n")
            wall, cpu, last = run(venv, root, "build", "//...")
            assert "1 actions run" in last, last
            times.setdefault(("one source edited", name), []).append((wall, cpu))
            wall, cpu, last = run(venv, root, "build", "//...")
            assert "nothing changed" in last, last
            times.setdefault(("no-op, fast path", name), []).append((wall, cpu))
    for _ in range(args.warm):
        for name, venv, root in sides:
            shutil.rmtree(root / "qbuild-out")
            wall, cpu, last = run(venv, root, "build", "//...")
            assert "0 actions run" in last, last
            times.setdefault(("warm build (cache, no outputs)", name), []).append((wall, cpu))
    if args.dir is None:
        shutil.rmtree(base, ignore_errors=True)
    names = [name for name, _, _ in sides]
    print(f"\n{args.targets + 1} targets; {args.rounds} alternated rounds (warm: {args.warm}); "
          f"load average {min(loads):.1f}–{max(loads):.1f}; medians, wall / CPU\n")
    print("| build | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for build in dict.fromkeys(build for build, _ in times):
        cells = []
        for name in names:
            runs = times[(build, name)]
            cells.append(f"{statistics.median(r[0] for r in runs) * 1000:.0f} / "
                         f"{statistics.median(r[1] for r in runs) * 1000:.0f} ms")
        print(f"| {build} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
