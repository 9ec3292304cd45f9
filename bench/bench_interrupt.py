"""Ctrl-C latency: time from SIGINT to the exit of ``qbuild build`` while actions run.

A workspace of two ``command`` targets that sleep 60 s is built with ``-j 2``; once
both are running, SIGINT is sent to the qbuild process. Measured: seconds until it
exits (must be 130) and whether any of the commands it started is still alive.

Run: ``python bench/bench_interrupt.py [--runs 5]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def one(root: Path) -> tuple[float, bool]:
    marks = root / "marks"
    shutil.rmtree(marks, ignore_errors=True)
    marks.mkdir()
    env = dict(os.environ)
    env.pop("QBUILD_CACHE_DIR", None)
    proc = subprocess.Popen([sys.executable, "-m", "qbuild", "build", "//p:all", "-j", "2"],
                            cwd=root, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    while len(list(marks.iterdir())) < 2:
        time.sleep(0.02)
    start = time.perf_counter()
    proc.send_signal(signal.SIGINT)
    code = proc.wait()
    seconds = time.perf_counter() - start
    assert code == 130, code
    time.sleep(0.2)
    alive = False
    for pid_file in marks.iterdir():
        try:
            os.kill(int(pid_file.read_text()), 0)
            alive = True
        except (ProcessLookupError, ValueError):
            pass
    return seconds, alive


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="qbuild-interrupt-"))
    try:
        (root / "p").mkdir()
        (root / "qbuild.toml").write_text(f'[settings]\ncache_dir = "{root / ".cache"}"\n')
        (root / "p" / "BUILD.toml").write_text("".join(
            f'[s{i}]\nrule = "command"\nouts = ["x"]\n'
            f'cmd = "echo $$ > {root}/marks/{i}; sleep 60; touch $(OUT)"\n' for i in range(2)))
        results = [one(root) for _ in range(args.runs)]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"SIGINT to exit (130): median {statistics.median(r[0] for r in results) * 1000:.0f} "
          f"ms, max {max(r[0] for r in results) * 1000:.0f} ms over {args.runs} runs; "
          f"commands left alive: {sum(r[1] for r in results)}")


if __name__ == "__main__":
    main()
