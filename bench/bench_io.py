"""Bytes read and written by the engine for a big source: one file through a filegroup
to two `command` consumers that do not read it (so every byte counted is the engine's:
hashing, staging, storing, restoring).

Each build runs in a fresh child process that reports its own /proc/self/io counters
(rchar/wchar: bytes through read/write/sendfile/copy_file_range system calls, page cache
or not; "to disk" is write_bytes minus cancelled_write_bytes, i.e. without data of files
deleted before write-back, such as sandbox copies; the consumers' shell processes are not
counted and do not read the file).
Cold = empty cache; warm = full cache, empty qbuild-out; no-op (full path) = nothing
changed, fast path disabled. Usage::

    python bench/bench_io.py [--size-mib 1024] [--runs 3] [--dir /mnt/xfs]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BUILD = """
[big]
rule = "filegroup"
srcs = ["big.bin"]

[c1]
rule = "command"
srcs = [":big"]
cmd = "echo one > $(OUT)"
outs = ["c1.txt"]

[c2]
rule = "command"
srcs = [":big"]
cmd = "echo two > $(OUT)"
outs = ["c2.txt"]
"""

CHILD = r"""
import json, sys, time
from pathlib import Path

def io():
    fields = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return {k: int(v) for k, v in fields.items()}

from qbuild.build.run import Build, BuildOptions
from qbuild.build.session import Session
from qbuild.analysis.plugins import load_registry
from qbuild.build.progress import ConsoleReporter
from qbuild.analysis.workspace import load_workspace
import io as _io

root = Path(sys.argv[1])
session = Session(load_workspace(root), load_registry())
labels = session.graph.expand(["//pkg:c1", "//pkg:c2"], "")
before, t = io(), time.perf_counter()
reporter = ConsoleReporter(_io.StringIO(), tty=False)
result = Build(session, BuildOptions(jobs=2), reporter).run(labels)
seconds, after = time.perf_counter() - t, io()
session.close()
assert result.ok, result.failed
print(json.dumps({"read": after["rchar"] - before["rchar"],
                  "written": after["wchar"] - before["wchar"],
                  "disk_written": after["write_bytes"] - before["write_bytes"]
                  - (after["cancelled_write_bytes"] - before["cancelled_write_bytes"]),
                  "seconds": seconds, "ran": len(result.ran)}))
"""


def _measure(root: Path) -> dict[str, float]:
    proc = subprocess.run([sys.executable, "-c", CHILD, str(root)], capture_output=True,
                          text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", default=None,
                        help="where to make the workspace and cache (e.g. on XFS or btrfs, "
                             "where private copies are reflinks)")
    args = parser.parse_args()
    size = args.size_mib << 20
    base = Path(tempfile.mkdtemp(prefix="qbuild-bench-io-", dir=args.dir))
    try:
        ws, cache = base / "ws", base / "cache"
        (ws / "pkg").mkdir(parents=True)
        (ws / "qbuild.toml").write_text(f'[settings]\ncache_dir = "{cache.as_posix()}"\n')
        (ws / "pkg" / "BUILD.toml").write_text(BUILD)
        with open(ws / "pkg" / "big.bin", "wb") as handle:
            for _ in range(size >> 20):
                handle.write(os.urandom(1 << 20))
        time.sleep(0.1)
        rows: dict[str, list[dict[str, float]]] = {"cold": [], "warm": [], "noop": []}
        for _ in range(args.runs):
            shutil.rmtree(cache, ignore_errors=True)
            shutil.rmtree(ws / "qbuild-out", ignore_errors=True)
            rows["cold"].append(_measure(ws))
            shutil.rmtree(ws / "qbuild-out", ignore_errors=True)
            rows["warm"].append(_measure(ws))
            rows["noop"].append(_measure(ws))
        gib = float(1 << 30)
        print(f"source {args.size_mib} MiB, {args.runs} runs (medians)")
        print("| build | read | written | written to disk | seconds | actions run |")
        print("|---|---|---|---|---|---|")
        for name, runs in rows.items():
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            print(f"| {name} | {med['read'] / gib:.2f} GiB | {med['written'] / gib:.2f} GiB | "
                  f"{med['disk_written'] / gib:.2f} GiB | {med['seconds']:.2f} s | "
                  f"{int(med['ran'])} |")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
