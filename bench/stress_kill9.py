"""kill -9 stress: a killed build never poisons the cache or leaves a wrong output.

A workspace of ``command`` targets (outputs of a few hundred KB, so stores take a
moment; a chain, a fan-out and a directory output) and ``filegroup``s (sources
forwarded into the store without a sandbox, one read by a ``command``) gets one of
three source variants per round. Each round starts ``qbuild build //...``, SIGKILLs
the main process at a random moment (sometimes its whole process group), then builds
again to completion and compares every output byte for byte with a clean build of the
same variant in a fresh workspace and cache. Every few rounds the cache is shrunk with
``qbuild cache gc`` so kills also land in rebuilds of evicted blobs.

Run: ``python bench/stress_kill9.py [--points 100] [--seed 1]``; exits 1 on any
mismatch. The test suite runs a short version (tests/engine/test_kill9_stress.py).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VARIANTS = 3


def write_workspace(root: Path, cache: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / "qbuild.toml").write_text(f'[settings]\ncache_dir = "{cache.as_posix()}"\n')
    blocks = []
    for i in range(4):
        blocks.append(f'[gen{i}]\nrule = "command"\nsrcs = ["s{i}.txt"]\nouts = ["g.bin"]\n'
                      'cmd = "awk \'{for (i = 0; i < 500; i++) print i, $0}\' '
                      '$(SRCS) > $(OUT)"\n')
    blocks.append('[join]\nrule = "command"\nsrcs = [":gen0", ":gen1", ":gen2", ":gen3"]\n'
                  'outs = ["j.bin", "parts/"]\n'
                  'cmd = "cat $(SRCS) > j.tmp; set -- $(OUTS); mv j.tmp $1; mkdir -p $2; '
                  'for i in 1 2 3; do head -c $((i * 1000)) $1 > $2/p$i; done"\n')
    for i in range(3):
        blocks.append(f'[tail{i}]\nrule = "command"\nsrcs = [":join"]\nouts = ["t.txt"]\n'
                      f'cmd = "cat $(SRCS) | sha256sum > $(OUT); echo {i} >> $(OUT)"\n')
    # Sources forwarded by filegroups (no sandbox: copied straight into the store).
    for i in range(4):
        blocks.append(f'[files{i}]\nrule = "filegroup"\nsrcs = ["s{i}.txt"]\n')
    blocks.append('[files]\nrule = "filegroup"\nsrcs = ["s0.txt", "s1.txt", "s2.txt", '
                  '"s3.txt"]\n')
    blocks.append('[count]\nrule = "command"\nsrcs = [":files"]\nouts = ["c.txt"]\n'
                  'cmd = "cat $(SRCS) | sha256sum > $(OUT)"\n')
    (root / "p").mkdir(exist_ok=True)
    (root / "p" / "BUILD.toml").write_text("\n".join(blocks))


def set_variant(root: Path, variant: int) -> None:
    for i in range(4):
        path = root / "p" / f"s{i}.txt"
        text = f"source {i} variant {variant if i % 2 == 0 else 0}\n" * 20
        if not path.exists() or path.read_text() != text:
            path.write_text(text)


def qbuild(root: Path, *args: str, **kw) -> subprocess.Popen:
    env = dict(os.environ)
    env.pop("QBUILD_CACHE_DIR", None)
    return subprocess.Popen([sys.executable, "-m", "qbuild", *args], cwd=root, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, **kw)


def outputs(root: Path) -> dict[str, bytes]:
    base = root / "qbuild-out"
    return {p.relative_to(base).as_posix(): p.read_bytes()
            for p in sorted(base.rglob("*")) if p.is_file() and ".qbuild" not in p.parts}


def reference(work: Path, variant: int) -> dict[str, bytes]:
    root = work / f"ref{variant}"
    write_workspace(root, work / f"ref{variant}-cache")
    set_variant(root, variant)
    proc = qbuild(root, "build", "//...")
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"reference build failed: {err}")
    return outputs(root)


def stress(points: int, seed: int, work: Path, log=print) -> list[str]:
    """Run ``points`` kill rounds; return the problems found (empty: all good)."""
    rng = random.Random(seed)
    refs = {v: reference(work, v) for v in range(VARIANTS)}
    root = work / "ws"
    write_workspace(root, work / "cache")
    problems = []
    for point in range(points):
        variant = rng.randrange(VARIANTS)
        set_variant(root, variant)
        if rng.random() < 0.15:
            subprocess.run([sys.executable, "-m", "qbuild", "cache", "gc", "--max-size",
                            rng.choice(["0", "300K"])], cwd=root, capture_output=True)
        if rng.random() < 0.2:
            shutil.rmtree(root / "qbuild-out", ignore_errors=True)
        proc = qbuild(root, "build", "//...", "-j", str(rng.choice([1, 2, 4])))
        time.sleep(rng.uniform(0.05, 1.2))
        if rng.random() < 0.5:
            os.kill(proc.pid, signal.SIGKILL)
        else:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        final = qbuild(root, "build", "//...")
        out, err = final.communicate()
        if final.returncode != 0:
            problems.append(f"point {point}: the build after the kill failed: {err.strip()}")
            continue
        got = outputs(root)
        if got != refs[variant]:
            wrong = sorted(k for k in set(got) | set(refs[variant])
                           if got.get(k) != refs[variant].get(k))
            problems.append(f"point {point} (variant {variant}): outputs differ: {wrong}")
        log(f"kill point {point + 1}/{points}: {'ok' if not problems else problems[-1]}")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="qbuild-kill9-"))
    try:
        problems = stress(args.points, args.seed, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for problem in problems:
        print(problem)
    print(f"{args.points} kill points, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
