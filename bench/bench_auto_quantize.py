"""Benchmark of auto_quantize against plain onnxruntime defaults, per model.

For each model a throw-away workspace is generated (the model, image datasets from
testdata/images: calibration images and held-out evaluation images never used to
calibrate), with three things built through the real `qbuild` command:

* ``plain``: `quantize` with onnxruntime's defaults (per-tensor weights, uint8, MinMax,
  no detection-safe joins), evaluated like the trials;
* ``auto``: `auto_quantize` with the stated bar, objective latency;
* the same `auto` build again after changing only the bar (time of the rebuild).

Latencies are evaluate's (median of 20 single-thread runs after 3 warm-ups; issue 16
replaces this measurement). Prints a markdown table. Run from the repository root:
python bench/bench_auto_quantize.py [model ...]   (models: mnist mobilenet yolov8 yolox)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ROOT / "testdata" / "images"
CAL = ["pineapple.jpg", "super_res_input.png", "test_colors.jpg", "wolves.jpg"]
EVAL = ["dog.jpg", "australia.jpg"]

MODELS = {
    "mnist": dict(src=ROOT / "testdata/models/mnist.onnx", input="Input3", size=[28, 28],
                  extra='color = "GRAY"', task="classification", task_options="{}",
                  bar="max_top1_drop = 0.05", metric="top1_drop"),
    "mobilenet": dict(src=ROOT / "testdata/models/mobilenet_v2_128_0.5.onnx",
                      input="input_1:0", size=[128, 128],
                      extra="scale = 0.00784313725490196\nmean = [1.0]",
                      task="classification", task_options="{}", bar="max_top1_drop = 0.05",
                      metric="top1_drop"),
    "yolov8": dict(src=ROOT / "testdata/models/yolov8_tiny.onnx", input="images",
                   size=[640, 640], extra='resize = "letterbox"', task="detection",
                   task_options='{ decoder = "yolov8", score_threshold = 0.5 }',
                   bar="min_f1 = 0.8", metric="f1"),
    "yolox": dict(src=ROOT / "examples/yolo/yolox_nano.onnx", input="images",
                  size=[416, 416], extra='resize = "letterbox"\nalign = "topleft"\n'
                  'color = "BGR"\nscale = 1.0', task="yolo", task_options="{}",
                  bar="min_f1 = 0.95", metric="f1"),
}

BUILD = """
[fp]
rule = "onnx_model"
src = "model.onnx"

[pre]
rule = "quant_preprocess"
model = ":fp"

[cal_images]
rule = "image_dataset"
images = ["cal/*"]
input = "{input}"
size = {size}
count = {cal_count}
{extra}

[eval_images]
rule = "image_dataset"
images = ["ev/*"]
input = "{input}"
size = {size}
count = {eval_count}
seed = 7
{extra}

[plain_calib]
rule = "calibrate"
model = ":pre"
dataset = ":cal_images"

[plain]
rule = "quantize"
model = ":pre"
calibration = ":plain_calib"
per_channel = false
float_joins_ratio = 0.0

[plain_ev]
rule = "evaluate"
models = [":plain"]
reference = ":pre"
dataset = ":eval_images"
task = "{task}"
task_options = {task_options}
latency_runs = 20

[auto]
rule = "auto_quantize"
model = ":pre"
calibration_data = ":cal_images"
evaluation_data = ":eval_images"
task = "{task}"
task_options = {task_options}
bar = {{ {bar} }}
"""


def _qbuild(ws: Path, *args: str) -> float:
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "qbuild", *args], cwd=ws, capture_output=True,
                       text=True)
    if r.returncode not in (0, 1):
        raise SystemExit(f"qbuild {' '.join(args)} failed:\n{r.stderr[-3000:]}")
    return time.perf_counter() - t


def bench(name: str, tmp: Path) -> dict:
    spec = MODELS[name]
    ws = tmp / name
    (ws / "m" / "cal").mkdir(parents=True)
    (ws / "m" / "ev").mkdir()
    (ws / "qbuild.toml").write_text(f'[settings]\ncache_dir = "{tmp / "cache"}"\n')
    shutil.copyfile(spec["src"], ws / "m" / "model.onnx")
    for f in CAL:
        shutil.copyfile(IMAGES / f, ws / "m" / "cal" / f)
    for f in EVAL:
        shutil.copyfile(IMAGES / f, ws / "m" / "ev" / f)
    build = BUILD.format(cal_count=16, eval_count=16, **spec)
    (ws / "m" / "BUILD.toml").write_text(build)
    search_s = _qbuild(ws, "build", "//m:auto", "//m:plain_ev", "-j", "1")
    # raise the bar a little: only the selection reruns
    (ws / "m" / "BUILD.toml").write_text(build.replace(spec["bar"], spec["bar"] + "1"))
    rebuild_s = _qbuild(ws, "build", "//m:auto", "-j", "1")
    out = ws / "qbuild-out" / "m"
    (ws / "m" / "BUILD.toml").write_text(build)
    _qbuild(ws, "build", "//m:auto", "//m:plain_ev", "-j", "1")
    auto = json.loads((out / "auto" / "report.json").read_text())
    plain = json.loads((out / "plain_ev" / "report.json").read_text())
    p = plain["models"]["//m:plain"]
    chosen = next((t for t in auto["trials"] if t["name"] == auto["chosen"]), auto["float"])
    key = "min_f1" if spec["metric"] == "f1" else "max_top1_drop"
    return {"model": name, "bar": spec["bar"], "float_ms": auto["float"]["latency_ms"],
            "float_bytes": auto["float"]["bytes"],
            "plain_metric": p["task"][spec["metric"]], "plain_ms": p.get("latency_ms"),
            "plain_bytes": p["bytes"], "chosen": auto["chosen"],
            "auto_metric": chosen.get(key), "auto_ms": chosen["latency_ms"],
            "auto_bytes": chosen["bytes"], "trials": len(auto["trials"]),
            "passing": sum(t["passes"] for t in auto["trials"]), "search_s": search_s,
            "rebuild_s": rebuild_s, "note": auto["note"]}


def main(names: list[str]) -> None:
    import onnxruntime

    tmp = Path(tempfile.mkdtemp(prefix="qbuild-bench-auto-"))
    rows = []
    try:
        for name in names:
            rows.append(bench(name, tmp))
            print(json.dumps(rows[-1]), file=sys.stderr)
    finally:
        if not os.environ.get("KEEP"):
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"onnxruntime {onnxruntime.__version__}, Python {sys.version.split()[0]}\n")
    print("| model | bar | float ms | plain ORT: metric / ms / KB | auto_quantize chosen | "
          "metric / ms / KB | trials (passing) | search s | rebuild after bar change s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['bar']} | {r['float_ms']} | {r['plain_metric']:.3f} / "
              f"{r['plain_ms']} / {r['plain_bytes'] // 1024} | {r['chosen']} | "
              f"{r['auto_metric'] if r['auto_metric'] is not None else '–'} / {r['auto_ms']} / "
              f"{r['auto_bytes'] // 1024} | {r['trials']} ({r['passing']}) | "
              f"{r['search_s']:.0f} | {r['rebuild_s']:.1f} |")
    for r in rows:
        print(f"\n- {r['model']}: {r['note']}")


if __name__ == "__main__":
    main(sys.argv[1:] or ["mnist", "mobilenet", "yolov8"])
