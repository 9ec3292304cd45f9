"""Two CI machines and a developer sharing one remote cache, on this machine.

    python examples/ci/simulate.py [--target //examples/yolo:yolo_int8] [--kind nginx]

Each "machine" is a fresh clone of this repository (``git clone`` of HEAD) with its own
empty local cache, all pointing at one cache server on 127.0.0.1 (nginx if installed,
else wsgidav):

1. ``main`` CI job: builds the target and uploads every result (the only writer).
2. pull-request CI job: the same target with one attribute changed; read-only
   (``--noremote_upload_local_results``), so it reruns only the changed actions and
   writes nothing to the shared cache.
3. developer: an unchanged clone; nothing runs, and only the requested outputs are
   downloaded ("build without the bytes").

Prints what each did (from ``--event_log``): actions run, remote hits, bytes moved, time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

from cache_server import start  # noqa: E402

# The pull request's change: the quantization step keeps two Convs fewer in float; only
# yolo_int8_q and what depends on it (yolo_int8) must run again.
PR_CHANGE = ('nodes_to_exclude = ["upto:729"]', 'nodes_to_exclude = ["upto:721"]')


def clone(dest: Path) -> Path:
    subprocess.run(["git", "clone", "--quiet", "--local", str(REPO), str(dest)], check=True)
    return dest


def build(machine: Path, target: str, url: str, *extra: str) -> dict:
    """Run ``qbuild build`` in ``machine``; return its summary and what it moved."""
    log = machine / "events.jsonl"
    env = dict(os.environ, QBUILD_CACHE_DIR=str(machine.parent / f"{machine.name}-cache"))
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "qbuild", "build", target,
                           f"--remote_cache={url}", f"--event_log={log}", *extra],
                          cwd=machine, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"build in {machine.name} failed:\n{proc.stderr}")
    events = [json.loads(line) for line in log.read_text().splitlines()]
    finished = events[-1]
    return {"seconds": seconds, "ran": finished["actions_run"],
            "remote_hits": finished.get("remote_cache_hits", 0),
            "down": finished["remote"]["bytes_downloaded"],
            "up": finished["remote"]["bytes_uploaded"],
            "ran_labels": [e["label"] for e in events
                           if e.get("event") == "action_finished" and e["origin"] == "ran"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="//examples/yolo:yolo_int8")
    parser.add_argument("--kind", choices=["auto", "nginx", "wsgidav"], default="auto")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="qbuild-ci-") as tmp:
        base = Path(tmp)
        server = start(base / "server", args.kind)
        print(f"cache server ({server.kind}): {server.url}")
        try:
            rows = []
            main_job = clone(base / "ci-main")
            rows.append(("CI main (uploads)", build(main_job, args.target, server.url)))
            pr_job = clone(base / "ci-pr")
            build_file = pr_job / "examples/yolo/BUILD.toml"
            build_file.write_text(build_file.read_text().replace(*PR_CHANGE))
            rows.append(("CI pull request (read-only)",
                         build(pr_job, args.target, server.url,
                               "--noremote_upload_local_results")))
            laptop = clone(base / "developer")
            rows.append(("developer", build(laptop, args.target, server.url)))
            print(f"{'machine':<30} {'ran':>4} {'remote hits':>11} {'down MB':>8} "
                  f"{'up MB':>7} {'time s':>7}")
            for name, row in rows:
                print(f"{name:<30} {row['ran']:>4} {row['remote_hits']:>11} "
                      f"{row['down'] / 1e6:>8.2f} {row['up'] / 1e6:>7.2f} "
                      f"{row['seconds']:>7.1f}")
            print("pull request reran:", ", ".join(rows[1][1]["ran_labels"]) or "nothing")
            print(f"server holds {server.stored_bytes() / 1e6:.1f} MB")
        finally:
            server.stop()


if __name__ == "__main__":
    main()
