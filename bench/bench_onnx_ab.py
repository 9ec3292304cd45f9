"""A/B benchmark of two qbuild source trees on an ONNX pipeline: ``bench_ab.py``'s
method (runs interleaved A, B, A, B, ...; wall and CPU time of qbuild and every process
it waited for; medians) on workspaces of real ONNX rules instead of generic ones.

    python bench/bench_onnx_ab.py --before /tmp/qbuild-main --after . [--runs 5]

Each of ``--packages`` packages builds MobileNetV2-0.5 at 128 px (testdata): onnx_model,
quant_preprocess, image_dataset (8 samples of two images, checked against the model),
calibrate, two quantize variants, bias_correction and evaluate of the three against the
pre-processed model. Measured: cold build (empty cache), no-op build on the fast path
and on the full path (``--explain``), and the rebuild after changing only evaluate's bar.
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
from bench_ab import fresh, run  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

BUILD = """
[mb]
rule = "onnx_model"
src = "mb.onnx"

[pre]
rule = "quant_preprocess"
model = ":mb"

[imgs]
rule = "image_dataset"
images = ["img/*.jpg"]
input = "input_1:0"
size = [128, 128]
resize = "crop"
scale = 0.00784313725490196
mean = [1.0]
count = 8
batch_size = 4
model = ":mb"

[calib]
rule = "calibrate"
model = ":pre"
dataset = ":imgs"

[q]
rule = "quantize"
model = ":pre"
calibration = ":calib"

[q_tensor]
rule = "quantize"
model = ":pre"
calibration = ":calib"
per_channel = false

[q_bc]
rule = "bias_correction"
model = ":q"
reference = ":pre"
dataset = ":imgs"

[ev]
rule = "evaluate"
models = [":q", ":q_tensor", ":q_bc"]
reference = ":pre"
dataset = ":imgs"
min_sqnr_db = {bar}
"""


def generate(root: Path, packages: int) -> None:
    root.mkdir(parents=True)
    (root / "qbuild.toml").write_text(f'[settings]\ncache_dir = "{root / ".cache"}"\n')
    for i in range(packages):
        pkg = root / f"p{i}"
        (pkg / "img").mkdir(parents=True)
        shutil.copyfile(ROOT / "testdata/models/mobilenet_v2_128_0.5.onnx", pkg / "mb.onnx")
        for name in ("dog.jpg", "wolves.jpg"):
            shutil.copyfile(ROOT / "testdata/images" / name, pkg / "img" / name)
        (pkg / "BUILD.toml").write_text(BUILD.format(bar=5.0))


def set_bar(root: Path, bar: float) -> None:
    for build in root.glob("p*/BUILD.toml"):
        build.write_text(BUILD.format(bar=bar))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--after", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--packages", type=int, default=2)
    args = parser.parse_args()
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    figures: dict[tuple[str, str], list[tuple[float, float]]] = {}
    base = Path(tempfile.mkdtemp(prefix="qbuild-onnx-ab-"))
    loads = []
    try:
        for name in trees:
            generate(base / name, args.packages)
        for _ in range(args.runs):
            for name, tree in trees.items():
                work = base / name
                set_bar(work, 5.0)
                fresh(work)
                loads.append(os.getloadavg()[0])
                figures.setdefault(("cold build", name), []).append(
                    run(tree, work, "build", "//..."))
                figures.setdefault(("no-op (fast path)", name), []).append(
                    run(tree, work, "build", "//..."))
                figures.setdefault(("no-op (full path)", name), []).append(
                    run(tree, work, "build", "--explain", "//..."))
                set_bar(work, 6.0)
                figures.setdefault(("evaluate's bar changed", name), []).append(
                    run(tree, work, "build", "//..."))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"medians of {args.runs} interleaved runs, {args.packages} package(s) of 8 "
          f"targets; load average {min(loads):.1f} to {max(loads):.1f} on "
          f"{os.cpu_count()} cores\n")
    print("| build | before: wall | after: wall | before: CPU | after: CPU |")
    print("|---|---|---|---|---|")
    for (what, name), values in figures.items():
        if name != "before":
            continue
        after = figures[(what, "after")]

        def med(values: list[tuple[float, float]], i: int) -> float:
            return statistics.median(v[i] for v in values)

        print(f"| {what} | {med(values, 0):.3f} s | {med(after, 0):.3f} s | "
              f"{med(values, 1):.3f} s | {med(after, 1):.3f} s |")


if __name__ == "__main__":
    main()
