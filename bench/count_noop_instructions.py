"""Instructions of a full-path no-op build (``qbuild build --explain //...``) on the
generated workspace of ``bench_engine.py``, counted by valgrind's callgrind: unlike
seconds, the count is the same whatever else the machine is doing, so two versions
compare on a busy machine. Each side gets a fresh workspace, built cold and once warm
first; a side is a Python interpreter with qbuild installed, or this interpreter with
``--pythonpath`` putting another checkout first (``DIR:DIR/plugins``).

    python bench/count_noop_instructions.py [--targets 2000] [--pythonpath DIR:DIR/plugins]

Needs ``valgrind`` (Debian's package). Prints the instruction count (about 50 times
slower than the build itself).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_engine import ENV, generate  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--targets", type=int, default=2000)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--pythonpath", default="")
    args = parser.parse_args()
    env = dict(ENV)
    if args.pythonpath:
        env["PYTHONPATH"] = args.pythonpath
    with tempfile.TemporaryDirectory(prefix="qbuild-instr-") as tmp:
        root = Path(tmp) / "ws"
        generate(root, args.targets)
        qbuild = [args.python, "-m", "qbuild", "build"]
        for extra in ([], ["--explain"]):  # cold, then warm (bytecode and stat memo)
            subprocess.run([*qbuild, *extra, "//..."], cwd=root, env=env, check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        out = Path(tmp) / "callgrind.out"
        run = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                              *qbuild, "--explain", "//..."], cwd=root, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        found = re.search(r"Collected : (\d+)", run.stderr)
        if run.returncode or not found:
            raise SystemExit(f"callgrind failed:\n{run.stderr[-2000:]}")
        count = int(found.group(1))
        print(f"{args.targets} targets, full-path no-op: {count:,} instructions "
              f"({count / args.targets:,.0f} per target, startup included)")


if __name__ == "__main__":
    main()
