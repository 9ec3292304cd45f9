"""Peak memory of calibration: qbuild's streaming collector vs onnxruntime's calibrator.

Each case runs in a fresh subprocess; peak RSS comes from resource.getrusage there and is
reported above the process's baseline (after importing numpy/onnx/onnxruntime and
opening the model). Usage::

    python bench/bench_calibration_memory.py [--samples 256] [--ort-samples 32] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "plugins"))

CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np, onnx, onnxruntime
from qbuild_onnx.source.datasets import open_dataset
kind, model, data, method, n = sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], int(sys.argv[6])
onnx.load(model)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
if kind == "qbuild":
    import tempfile
    from qbuild_onnx.calibration.calibrate import CalibrationOptions, calibrate
    calibrate(model, data, tempfile.mkdtemp(), CalibrationOptions(method=method, batch_size=1))
else:
    import tempfile, os
    from onnxruntime.quantization.calibrate import CalibrationMethod, create_calibrator
    ds = open_dataset(data)
    class Reader:
        def __init__(self): self.it = iter(list(range(n)))
        def get_next(self):
            i = next(self.it, None)
            return None if i is None else {"images": ds.read("images", i, i + 1)}
    m = {"entropy": CalibrationMethod.Entropy, "minmax": CalibrationMethod.MinMax}[method]
    cal = create_calibrator(model, augmented_model_path=os.path.join(tempfile.mkdtemp(), "a.onnx"),
                            calibrate_method=m, extra_options={"num_bins": 2048})
    cal.collect_data(Reader())
    cal.compute_data()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"base_mb": base / 1024, "peak_mb": peak / 1024,
                  "delta_mb": (peak - base) / 1024, "seconds": time.perf_counter() - t}))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=256)
    ap.add_argument("--ort-samples", type=int, default=32)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--model", default=str(ROOT / "examples/yolo/yolox_nano.onnx"))
    args = ap.parse_args()
    from qbuild_onnx.source.images import ImageOptions, build_image_dataset

    tmp = Path(tempfile.mkdtemp())
    cases = [("qbuild", "entropy", args.samples), ("qbuild", "minmax", args.samples),
             ("ort", "entropy", args.ort_samples)]
    datasets = {}
    for n in sorted({c[2] for c in cases}):
        d = tmp / f"ds{n}"
        build_image_dataset(d, [ROOT / "testdata/images"], "images",
                            ImageOptions(height=416, width=416, resize="letterbox",
                                         align="topleft", color="BGR", scale=1.0, count=n))
        datasets[n] = d
    rows = []
    for kind, method, n in cases:
        runs = []
        for _ in range(args.runs):
            out = subprocess.run([sys.executable, "-c", CHILD, str(ROOT / "plugins"), kind,
                                  args.model, str(datasets[n]), method, str(n)],
                                 capture_output=True, text=True, check=True)
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        row = {"collector": kind, "method": method, "samples": n,
               "delta_mb": round(statistics.median(r["delta_mb"] for r in runs), 1),
               "base_mb": round(statistics.median(r["base_mb"] for r in runs), 1),
               "seconds": round(statistics.median(r["seconds"] for r in runs), 1)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(json.dumps({"model": Path(args.model).name, "runs": args.runs,
                      "time": time.strftime("%Y-%m-%d"), "cases": rows}))


if __name__ == "__main__":
    main()
