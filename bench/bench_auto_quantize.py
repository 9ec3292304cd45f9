"""Benchmark of auto_quantize against plain onnxruntime defaults, per model.

For each model a throw-away workspace is generated (the model and its datasets: for image
models calibration images and held-out evaluation images never used to calibrate; for the
speech models windows/frames of `silero_test.wav` from the shared corpus, the first part
to calibrate, the rest to evaluate), with three things built through the real `qbuild`
command:

* ``plain``: `quantize` with onnxruntime's `quantize_static` defaults (per-tensor
  weights, uint8 activations, MinMax, no detection-safe joins);
* ``auto``: `auto_quantize` with the stated bar, objective latency, default trials;
* the same `auto` build again after changing only the bar (time of the rebuild);
* ``final``: one `evaluate` timing float, the chosen model and plain together,
  interleaved in one process on one thread (the figures of the table).

Prints a markdown table. Run from the repository root:
python bench/bench_auto_quantize.py [model ...]
(models: mnist mobilenet yolov8 yolox silero superres ultraface gtcrn)
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

CORPUS = Path("/work/shared/corpus")
SIGNAL_BAR = "min_sqnr_db = 30"   # the documented default threshold for signal outputs

MODELS = {
    "mnist": dict(src=ROOT / "testdata/models/mnist.onnx", input="Input3", size=[28, 28],
                  extra='color = "GRAY"', task="classification", task_options="{}",
                  bar="max_top1_drop = 0.01", metric="top1_drop"),
    "mobilenet": dict(src=ROOT / "testdata/models/mobilenet_v2_128_0.5.onnx",
                      input="input_1:0", size=[128, 128],
                      extra="scale = 0.00784313725490196\nmean = [1.0]",
                      task="classification", task_options="{}", bar="max_top1_drop = 0.01",
                      metric="top1_drop"),
    "yolov8": dict(src=ROOT / "testdata/models/yolov8_tiny.onnx", input="images",
                   size=[640, 640], extra='resize = "letterbox"', task="detection",
                   task_options='{ decoder = "yolov8", score_threshold = 0.5 }',
                   bar="min_f1 = 0.8", metric="f1"),
    "yolox": dict(src=ROOT / "examples/yolo/yolox_nano.onnx", input="images",
                  size=[416, 416], extra='resize = "letterbox"\nalign = "topleft"\n'
                  'color = "BGR"\nscale = 1.0', task="yolo", task_options="{}",
                  bar="min_f1 = 0.95", metric="f1"),
    "superres": dict(src=CORPUS / "models/super_resolution/pytorch_super_resolution.onnx",
                     input="input", size=[224, 224], extra='color = "GRAY"', task="psnr",
                     task_options="{}", bar="min_psnr_db = 30", metric="worst_psnr_db"),
    "ultraface": dict(src=CORPUS / "models/ultraface/version-slim-320.onnx", input="input",
                      size=[240, 320], extra="scale = 0.0078125\nmean = [0.9921875]",
                      task="detection",
                      task_options='{ decoder = "ssd", boxes_output = "boxes", '
                      'scores_output = "scores", background_class = true, '
                      'score_threshold = 0.7 }', bar="min_f1 = 0.95", metric="f1"),
    "silero": dict(src=ROOT / "testdata/models/silero_vad_v3.1_transformer.onnx",
                   audio="silero", task="sqnr", task_options="{}", bar=SIGNAL_BAR,
                   metric="worst_sqnr_db"),
    "gtcrn": dict(src=CORPUS / "models/gtcrn/gtcrn.onnx", audio="gtcrn", task="sqnr",
                  task_options="{}", bar=SIGNAL_BAR, metric="worst_sqnr_db"),
}

IMAGE_DATA = """
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
"""

AUDIO_DATA = """
[cal_images]
rule = "numpy_dataset"
files = ["cal.npz"]

[eval_images]
rule = "numpy_dataset"
files = ["ev.npz"]
"""


def _wav():
    import wave

    import numpy as np

    with wave.open(str(CORPUS / "audio" / "silero_test.wav"), "rb") as w:
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    return pcm.astype(np.float32) / 32768.0


def _streamed(model: Path, first: dict, state: dict, step, n: int) -> dict:
    """Inputs of ``n`` consecutive streaming steps of the float model (each step's state
    inputs, ``state``: input -> output, are the previous step's state outputs), stacked
    one rank higher."""
    import numpy as np
    import onnxruntime as ort

    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    feeds, out = dict(first), {k: [] for k in first}
    for i in range(n):
        feeds.update(step(i))
        for k, v in feeds.items():
            out[k].append(v)
        res = dict(zip(names, sess.run(None, feeds)))
        feeds.update({k: res[v] for k, v in state.items()})
    return {k: np.stack(v).astype(v[0].dtype) for k, v in out.items()}


def _audio_data(kind: str, src: Path, folder: Path) -> None:
    import numpy as np

    audio = _wav()
    if kind == "silero":
        win = 512
        chunks = [audio[s:s + win] for s in range(0, 64 * win * 4, win * 4)]
        first = {"input": chunks[0][None], "h0": np.zeros((2, 1, 64), np.float32),
                 "c0": np.zeros((2, 1, 64), np.float32)}
        data = _streamed(src, first, {"h0": "hn", "c0": "cn"},
                         lambda i: {"input": chunks[i][None]}, len(chunks))
    else:  # gtcrn: STFT frames (n_fft 512, hop 256, sqrt-Hann), caches streamed
        n_fft, hop = 512, 256
        win = np.sqrt(np.hanning(n_fft + 1)[:-1]).astype(np.float32)
        frames = [np.fft.rfft(audio[s:s + n_fft] * win) for s in range(0, 64 * hop, hop)]
        mix = [np.stack([f.real, f.imag], -1).astype(np.float32)[None, :, None, :]
               for f in frames]
        first = {"mix": mix[0], "conv_cache": np.zeros((2, 1, 16, 16, 33), np.float32),
                 "tra_cache": np.zeros((2, 3, 1, 1, 16), np.float32),
                 "inter_cache": np.zeros((2, 1, 33, 16), np.float32)}
        state = {"conv_cache": "conv_cache_out", "tra_cache": "tra_cache_out",
                 "inter_cache": "inter_cache_out"}
        data = _streamed(src, first, state, lambda i: {"mix": mix[i]}, len(mix))
    n = next(iter(data.values())).shape[0]
    np.savez(folder / "cal.npz", **{k: v[: n // 2] for k, v in data.items()})
    np.savez(folder / "ev.npz", **{k: v[n // 2:] for k, v in data.items()})


BUILD = """
[fp]
rule = "onnx_model"
src = "model.onnx"

[pre]
rule = "quant_preprocess"
model = ":fp"

{data}
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

[final]
rule = "evaluate"
models = [":auto", ":plain"]
reference = ":pre"
dataset = ":eval_images"
task = "{task}"
task_options = {task_options}
latency_runs = 40
"""


def _qbuild(ws: Path, *args: str) -> float:
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "qbuild", *args], cwd=ws, capture_output=True,
                       text=True)
    if r.returncode not in (0, 1):
        raise SystemExit(f"qbuild {' '.join(args)} failed:\n{r.stderr[-3000:]}")
    if r.returncode == 1:  # a failed target: say which, the table would hide it
        print(f"qbuild {' '.join(args)} exited 1:\n{r.stderr[-3000:]}", file=sys.stderr)
    return time.perf_counter() - t


def _metric(entry: dict, metric: str):
    if metric == "worst_sqnr_db":
        vals = [float(m["sqnr_db"]) for m in entry["outputs"].values()]
        return min(vals) if vals else None
    if metric == "worst_psnr_db":
        return (entry.get("task") or {}).get("score")
    return (entry.get("task") or {}).get(metric)


def _speedup(entry: dict) -> float | None:
    ratio = (entry.get("latency") or {}).get("ratio_to_reference")
    return round(1.0 / ratio, 3) if ratio else None


def bench(name: str, tmp: Path) -> dict:
    spec = MODELS[name]
    ws = tmp / name
    (ws / "m" / "cal").mkdir(parents=True, exist_ok=True)
    (ws / "m" / "ev").mkdir(exist_ok=True)
    (ws / "qbuild.toml").write_text(f'[settings]\ncache_dir = "{tmp / "cache"}"\n')
    shutil.copyfile(spec["src"], ws / "m" / "model.onnx")
    if "audio" in spec:
        _audio_data(spec["audio"], spec["src"], ws / "m")
        data = AUDIO_DATA
    else:
        for f in CAL:
            shutil.copyfile(IMAGES / f, ws / "m" / "cal" / f)
        for f in EVAL:
            shutil.copyfile(IMAGES / f, ws / "m" / "ev" / f)
        data = IMAGE_DATA.format(cal_count=16, eval_count=16, **spec)
    build = BUILD.format(data=data, **spec)
    (ws / "m" / "BUILD.toml").write_text(build)
    search_s = _qbuild(ws, "build", "//m:auto", "//m:plain_ev", "-j", "1")
    # raise the bar a little: only the selection reruns
    (ws / "m" / "BUILD.toml").write_text(build.replace(spec["bar"], spec["bar"] + "1"))
    rebuild_s = _qbuild(ws, "build", "//m:auto", "-j", "1")
    out = ws / "qbuild-out" / "m"
    (ws / "m" / "BUILD.toml").write_text(build)
    _qbuild(ws, "build", "//m:auto", "//m:final", "-j", "1")
    auto = json.loads((out / "@auto" / "report.json").read_text())
    final = json.loads((out / "@final" / "report.json").read_text())
    a, p = final["models"]["//m:auto"], final["models"]["//m:plain"]
    return {"model": name, "bar": spec["bar"], "float_ms": final["reference_latency_ms"],
            "float_bytes": final.get("reference_bytes"),
            "plain_metric": _metric(p, spec["metric"]), "plain_ms": p.get("latency_ms"),
            "plain_bytes": p["bytes"], "chosen": auto["chosen"],
            "auto_metric": _metric(a, spec["metric"]), "auto_ms": a["latency_ms"],
            "auto_bytes": a["bytes"], "auto_spread": a["latency"]["spread"],
            "plain_spread": p["latency"]["spread"],
            # per-round ratios to float timed in the same run: the figure that survives load
            "plain_speedup": _speedup(p), "auto_speedup": _speedup(a),
            "trials": len(auto["trials"]),
            "passing": sum(t["passes"] for t in auto["trials"]),
            "failed": [t["name"] for t in auto["trials"] if t.get("status") == "failed"],
            "nothing": [t["name"] for t in auto["trials"]
                        if t.get("status") == "quantizes nothing"],
            "search_s": search_s,
            "rebuild_s": rebuild_s, "note": auto["note"],
            "trial_rows": [(t["name"], t.get(list(auto["bar"])[0]), t.get("speedup"),
                            t["passes"]) for t in auto["trials"]]}


def main(names: list[str]) -> None:
    import onnxruntime

    # BENCH_DIR reuses a folder (and its cache) of an earlier run
    tmp = Path(os.environ.get("BENCH_DIR") or tempfile.mkdtemp(prefix="qbuild-bench-auto-"))
    rows = []
    try:
        for name in names:
            rows.append(bench(name, tmp))
            print(json.dumps(rows[-1]), file=sys.stderr)
    finally:
        if not os.environ.get("KEEP") and not os.environ.get("BENCH_DIR"):
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"onnxruntime {onnxruntime.__version__}, Python {sys.version.split()[0]}\n")
    # speed-up: median over interleaved rounds of float time / model time (same process)
    print("| model | bar | float ms | plain ORT: metric / ms (speed-up) / KB | "
          "auto_quantize chosen | metric / ms (speed-up) / KB | trials (passing) | "
          "search s | rebuild after bar change s |")
    print("|---|---|---|---|---|---|---|---|---|")

    def f(v):
        return "–" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)

    for r in rows:
        fl = r["float_ms"]
        print(f"| {r['model']} | {r['bar']} | {fl} | {f(r['plain_metric'])} / "
              f"{r['plain_ms']} ({r['plain_speedup']}x, spread {r['plain_spread']}) / "
              f"{r['plain_bytes'] // 1024} | "
              f"{r['chosen']} | {f(r['auto_metric'])} / {r['auto_ms']} "
              f"({r['auto_speedup']}x, spread {r['auto_spread']}) / "
              f"{r['auto_bytes'] // 1024} | "
              f"{r['trials']} ({r['passing']}) | {r['search_s']:.0f} | {r['rebuild_s']:.1f} |")
    for r in rows:
        print(f"\n- {r['model']}: {r['note']}\n  trials (name, bar metric, speed-up "
              f"in its own interleaved run, passes): {r['trial_rows']}")
        if r["failed"] or r["nothing"]:
            print(f"  failed (left out): {r['failed'] or 'none'}; quantize nothing (left "
                  f"out): {r['nothing'] or 'none'}")


if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]) or not set(sys.argv[1:]) <= set(MODELS):
        print(__doc__)
        raise SystemExit(0 if {"-h", "--help"} & set(sys.argv[1:]) else 2)
    main(sys.argv[1:] or ["mobilenet", "silero", "superres", "ultraface", "gtcrn", "yolov8"])
