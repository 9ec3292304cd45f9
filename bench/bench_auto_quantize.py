"""Benchmark of auto_quantize on models the project has not tuned for (issue 25), per model.

For each model a throw-away workspace is generated with the model and three disjoint
datasets: for image models the 89 photographs of `testdata/photos`, split by
`image_dataset`'s `split` (by each image's content: ~30 % calibration, 35 % selection,
35 % evaluation); for the speech models 96 consecutive streamed windows/frames of
`silero_test.wav` from the shared corpus, the first third to calibrate, the second to
select, the last to report on. Everything is what the docs tell a user: the
documented task, decoder and bar for each task, default trials, objective latency, no
node names, no per-model tuning. Built through the real `qbuild` command:

* ``plain``: `quantize` with onnxruntime's `quantize_static` defaults (per-tensor
  weights, uint8 activations, MinMax, no detection-safe joins), for comparison;
* ``auto``: `auto_quantize` choosing on the selection set;
* ``final``: one `evaluate` on the held-out set (never used to choose) timing float, the
  chosen model and plain together, interleaved in one process on one thread (the
  table's metric and speed-up; spread = the per-round ratios' interquartile range).

With ``BENCH_ROWS=file.jsonl`` each model's row is appended to that file and the table
printed holds every row in it (one model per run); ``--table FILE`` prints it again.
Run from the repository root:
python bench/bench_auto_quantize.py [model ...]
(models: mobilenet yolov8 yolox superres ultraface silero gtcrn; fastestdet ppocr_cls
ssd_int8 are listed as not available offline)
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PHOTOS = ROOT / "testdata" / "photos"

CORPUS = Path("/work/shared/corpus")
# the docs' bars: detection `min_f1 = 0.95` (accuracy-tools.md, auto_quantize), classification
# `max_top1_drop = 0.1` (walkthrough: what 31 photographs can decide), signals 30 dB
DETECTION_BAR = "min_f1 = 0.95"
SIGNAL_BAR = "min_sqnr_db = 30"

MODELS = {
    "mobilenet": dict(label="MobileNetV2 0.5/128",
                      src=ROOT / "testdata/models/mobilenet_v2_128_0.5.onnx",
                      input="input_1:0", size=[128, 128],
                      extra="scale = 0.00784313725490196\nmean = [1.0]",
                      task="classification", task_options="{}", bar="max_top1_drop = 0.1",
                      metric="top1_drop"),
    "yolov8": dict(label="YOLOv8-style (`yolov8_tiny.onnx`, 640 px)",
                   src=ROOT / "testdata/models/yolov8_tiny.onnx", input="images",
                   size=[640, 640], extra='resize = "letterbox"', task="detection",
                   task_options='{ decoder = "yolov8", score_threshold = 0.5 }',
                   bar=DETECTION_BAR, metric="f1"),
    "yolox": dict(label="YOLOX-Nano", src=ROOT / "examples/yolo/yolox_nano.onnx",
                  input="images",
                  size=[416, 416], extra='resize = "letterbox"\nalign = "topleft"\n'
                  'color = "BGR"\nscale = 1.0', task="yolo", task_options="{}",
                  bar=DETECTION_BAR, metric="f1"),
    "superres": dict(label="super-resolution (224 px)",
                     src=CORPUS / "models/super_resolution/pytorch_super_resolution.onnx",
                     input="input", size=[224, 224], extra='color = "GRAY"', task="psnr",
                     task_options="{}", bar="min_psnr_db = 30", metric="worst_psnr_db"),
    "ultraface": dict(label="UltraFace slim-320",
                      src=CORPUS / "models/ultraface/version-slim-320.onnx", input="input",
                      size=[240, 320], extra="scale = 0.0078125\nmean = [0.9921875]",
                      task="detection",
                      task_options='{ decoder = "ssd", boxes_output = "boxes", '
                      'scores_output = "scores", background_class = true, '
                      'score_threshold = 0.7 }', bar=DETECTION_BAR, metric="f1"),
    "silero": dict(label="Silero VAD v3.1",
                   src=ROOT / "testdata/models/silero_vad_v3.1_transformer.onnx",
                   audio="silero", task="sqnr", task_options="{}", bar=SIGNAL_BAR,
                   metric="worst_sqnr_db"),
    "gtcrn": dict(label="GTCRN", src=CORPUS / "models/gtcrn/gtcrn.onnx", audio="gtcrn",
                  task="sqnr",
                  task_options="{}", bar=SIGNAL_BAR, metric="worst_sqnr_db"),
}
# issue 25's other unseen models: no copy in the repository or the shared corpus, and
# this benchmark downloads nothing
UNAVAILABLE = {"fastestdet": "FastestDet", "ppocr_cls": "PP-OCR text-direction classifier",
               "ssd_int8": "an already-quantized SSD"}

IMAGE_DATA = """
[photos]
rule = "image_dataset"
images = ["photos"]
split = "calibration"
input = "{input}"
size = {size}
{extra}
variants = {{ select = {{ split = "selection" }}, eval = {{ split = "evaluation" }} }}
"""

AUDIO_DATA = """
[audio]
rule = "numpy_dataset"
files = ["cal.npz"]

[audio_select]
rule = "numpy_dataset"
files = ["select.npz"]

[audio_eval]
rule = "numpy_dataset"
files = ["eval.npz"]
"""
IMAGE_SETS = dict(cal=":photos", sel=":photos.select", ev=":photos.eval")
AUDIO_SETS = dict(cal=":audio", sel=":audio_select", ev=":audio_eval")
STEPS = 96  # streamed steps of the speech models: 32 per set


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
        chunks = [audio[s:s + win] for s in range(0, STEPS * win * 4, win * 4)]
        first = {"input": chunks[0][None], "h0": np.zeros((2, 1, 64), np.float32),
                 "c0": np.zeros((2, 1, 64), np.float32)}
        data = _streamed(src, first, {"h0": "hn", "c0": "cn"},
                         lambda i: {"input": chunks[i][None]}, len(chunks))
    else:  # gtcrn: STFT frames (n_fft 512, hop 256, sqrt-Hann), caches streamed
        n_fft, hop = 512, 256
        win = np.sqrt(np.hanning(n_fft + 1)[:-1]).astype(np.float32)
        frames = [np.fft.rfft(audio[s:s + n_fft] * win) for s in range(0, STEPS * hop, hop)]
        mix = [np.stack([f.real, f.imag], -1).astype(np.float32)[None, :, None, :]
               for f in frames]
        first = {"mix": mix[0], "conv_cache": np.zeros((2, 1, 16, 16, 33), np.float32),
                 "tra_cache": np.zeros((2, 3, 1, 1, 16), np.float32),
                 "inter_cache": np.zeros((2, 1, 33, 16), np.float32)}
        state = {"conv_cache": "conv_cache_out", "tra_cache": "tra_cache_out",
                 "inter_cache": "inter_cache_out"}
        data = _streamed(src, first, state, lambda i: {"mix": mix[i]}, len(mix))
    # three consecutive stretches of the recording: calibrate, select, report
    third = next(iter(data.values())).shape[0] // 3
    for i, part in enumerate(("cal", "select", "eval")):
        np.savez(folder / f"{part}.npz",
                 **{k: v[i * third:(i + 1) * third] for k, v in data.items()})


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
dataset = "{cal}"

[plain]
rule = "quantize"
model = ":pre"
calibration = ":plain_calib"
per_channel = false
float_joins_ratio = 0.0

[auto]
rule = "auto_quantize"
model = ":pre"
calibration_data = "{cal}"
evaluation_data = "{sel}"
task = "{task}"
task_options = {task_options}
bar = {{ {bar} }}

[final]
rule = "evaluate"
models = [":auto", ":plain"]
reference = ":pre"
dataset = "{ev}"
task = "{task}"
task_options = {task_options}
latency_runs = 40
"""


def _qbuild(ws: Path, *args: str) -> tuple[float, str]:
    """Wall seconds of one `qbuild` run and what it printed (stdout and stderr)."""
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "qbuild", *args], cwd=ws, capture_output=True,
                       text=True)
    said = r.stdout + r.stderr
    with (ws / "build.log").open("a") as log:
        log.write(f"$ qbuild {' '.join(args)} (exit {r.returncode})\n{said}\n")
    if r.returncode not in (0, 1):
        raise SystemExit(f"qbuild {' '.join(args)} failed:\n{r.stderr[-3000:]}")
    if r.returncode == 1:  # a failed target: say which, the table would hide it
        print(f"qbuild {' '.join(args)} exited 1:\n{r.stderr[-3000:]}", file=sys.stderr)
    return time.perf_counter() - t, said


def _metric(entry: dict, metric: str):
    if metric == "worst_sqnr_db":
        vals = [float(m["sqnr_db"]) for m in entry["outputs"].values()]
        return min(vals) if vals else None
    if metric == "worst_psnr_db":
        return (entry.get("task") or {}).get("score")
    return (entry.get("task") or {}).get(metric)


def _meets(bar: str, value) -> bool | None:
    name, limit = (s.strip() for s in bar.split("="))
    if value is None:
        return None
    return value <= float(limit) if name.startswith("max_") else value >= float(limit)


def _speed(entry: dict) -> dict:
    """Speed-up against the float baseline from the final interleaved run (CPU time of
    one thread): the median per-round ratio and its interquartile range, inverted."""
    lat = entry.get("latency") or {}
    cpu = lat.get("cpu") or lat
    r, q1, q3 = (cpu.get(k) for k in ("ratio_to_reference", "ratio_q1", "ratio_q3"))
    return {"speedup": round(1 / r, 3) if r else None,
            "low": round(1 / q3, 3) if q3 else None, "high": round(1 / q1, 3) if q1 else None,
            "slower": lat.get("slower_than_reference")}


def _said_about(said: str, label: str) -> list[str]:
    """The console lines a build printed about one target (warnings and failures)."""
    return [ln.strip() for ln in said.splitlines()
            if label in ln and not ln.lstrip().startswith("[")]


def bench(name: str, tmp: Path) -> dict:
    spec = MODELS[name]
    ws = tmp / name
    (ws / "m").mkdir(parents=True, exist_ok=True)
    (ws / "qbuild.toml").write_text(f'[settings]\ncache_dir = "{tmp / "cache"}"\n')
    shutil.copyfile(spec["src"], ws / "m" / "model.onnx")
    if "audio" in spec:
        _audio_data(spec["audio"], spec["src"], ws / "m")
        data, sets = AUDIO_DATA, AUDIO_SETS
    else:
        shutil.copytree(PHOTOS, ws / "m" / "photos", dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("BUILD.toml"))
        data, sets = IMAGE_DATA.format(**spec), IMAGE_SETS
    (ws / "m" / "BUILD.toml").write_text(BUILD.format(data=data, **sets, **spec))
    load0 = os.getloadavg()[0]
    search_s, said = _qbuild(ws, "build", "//m:auto", "-j", "1")
    _, said_final = _qbuild(ws, "build", "//m:final", sets["cal"].replace(":", "//m:"),
                            "-j", "1")
    load1 = os.getloadavg()[0]
    out = ws / "qbuild-out" / "m"
    auto = json.loads((out / "@auto" / "report.json").read_text())
    final = json.loads((out / "@final" / "report.json").read_text())
    a, p = final["models"]["//m:auto"], final["models"]["//m:plain"]
    chosen_row = next((t for t in auto["trials"] if t["name"] == auto["chosen"]), {})
    held = _metric(a, spec["metric"])
    return {"model": name, "label": spec["label"], "bar": spec["bar"],
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "load": [round(load0, 1), round(load1, 1)],
            "chosen": auto["chosen"], "note": auto["note"],
            "selection_metric": chosen_row.get(spec["bar"].split("=")[0].strip()),
            "held_out_metric": held, "held_out_meets": _meets(spec["bar"], held),
            "plain_metric": _metric(p, spec["metric"]),
            "auto_speed": _speed(a), "plain_speed": _speed(p),
            "float_ms": final["reference_latency_ms"],
            "baseline": (final.get("latency") or {}).get("baseline"),
            "held_out_set": {k: v for k, v in (final.get("evaluation_set") or {}).items()
                             if k != "warning"},
            "selection_set": {k: v for k, v in (auto.get("selection_set") or {}).items()
                              if k != "warning"},
            "trials": len(auto["trials"]), "passing": sum(t["passes"] for t in auto["trials"]),
            "failed": {t["name"]: t.get("failed") for t in auto["trials"]
                       if t.get("status") == "failed"},
            "nothing": [t["name"] for t in auto["trials"]
                        if t.get("status") == "quantizes nothing"],
            "said": _said_about(said, "//m:auto"),
            "said_final": _said_about(said_final, "//m:final"),
            "search_s": round(search_s)}


def _f(v) -> str:
    return "–" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)


def _verdict(r: dict) -> str:
    if r["chosen"] == "float":
        kept = "WARNING: //m:auto: kept the float model: "
        why = next((ln[len(kept):] for ln in r["said"] if ln.startswith(kept)),
                   "**the build printed no reason**")
        return f"keeps float: {why}"
    if r["held_out_meets"]:
        return "meets bar (held out too)"
    return f"meets bar on selection, **misses it held out** ({_f(r['held_out_metric'])})"


def table(rows: list[dict]) -> str:
    lines = ["| model | bar | sets: calibrate / select / held out | chosen (trials passing) | "
             "held-out metric (selection; plain ORT) | speed-up vs float, IQR | verdict | "
             "slower than "
             "float? |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "unavailable" in r:
            lines.append(f"| {r['label']} | – | – | not available offline | – | – | – | – |")
            continue
        s, h = r["auto_speed"], r["held_out_set"]
        dets = (f", {h['reference_detections']} float detections" if
                "reference_detections" in h else "")
        slower = ("no (float itself)" if r["chosen"] == "float" else
                  "**yes**" if s["slower"] else "no")
        lines.append(
            f"| {r['label']} | {r['bar']} | {r['sets']} / {h.get('samples')}{dets} | "
            f"{r['chosen']} ({r['passing']} of {r['trials']}) | {_f(r['held_out_metric'])} "
            f"({_f(r['selection_metric'])}; {_f(r['plain_metric'])}) | "
            f"{_f(s['speedup'])}x ({_f(s['low'])}–{_f(s['high'])}) "
            f"| {_verdict(r)} | {slower} |")
    return "\n".join(lines)


def main(names: list[str]) -> None:
    import onnx
    import onnxruntime

    # BENCH_DIR reuses a folder (and its cache) of an earlier run
    tmp = Path(os.environ.get("BENCH_DIR") or tempfile.mkdtemp(prefix="qbuild-bench-auto-"))
    rows_file = Path(os.environ["BENCH_ROWS"]) if os.environ.get("BENCH_ROWS") else None
    rows: list[dict] = []
    versions = (f"onnxruntime {onnxruntime.__version__}, onnx {onnx.__version__}, Python "
                f"{platform.python_version()}")
    try:
        for name in names:
            if name in UNAVAILABLE:
                row = {"model": name, "label": UNAVAILABLE[name], "unavailable": True}
            else:
                row = bench(name, tmp)
                row["versions"] = versions
                row["sets"] = _set_sizes(tmp / name)
            rows.append(row)
            if rows_file:
                with rows_file.open("a") as fh:
                    fh.write(json.dumps(row) + "\n")
            print(json.dumps(row), file=sys.stderr)
    finally:
        if not os.environ.get("KEEP") and not os.environ.get("BENCH_DIR"):
            shutil.rmtree(tmp, ignore_errors=True)
    if rows_file:  # every row of the file: models measured one run at a time
        rows = [json.loads(ln) for ln in rows_file.read_text().splitlines() if ln.strip()]
    print(table(rows))


def _set_sizes(ws: Path) -> str:
    """'calibration / selection' sample counts of a workspace's datasets."""
    manifest = ws / "qbuild-out" / "m" / "@photos" / "data" / "dataset.json"
    if manifest.exists():
        sizes = json.loads(manifest.read_text())["source"]["split"]["sizes"]
        return f"{sizes['calibration']} / {sizes['selection']}"
    return " / ".join(str(_npz_len(ws / "m" / f"{p}.npz")) for p in ("cal", "select"))


def _npz_len(path: Path) -> int:
    import numpy as np

    with np.load(path) as z:
        return int(next(iter(z.values())).shape[0])


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--table"] and len(args) == 2:
        print(table([json.loads(ln) for ln in Path(args[1]).read_text().splitlines()
                     if ln.strip()]))
        raise SystemExit(0)
    known = set(MODELS) | set(UNAVAILABLE)
    if {"-h", "--help"} & set(args) or not set(args) <= known:
        print(__doc__)
        raise SystemExit(0 if {"-h", "--help"} & set(args) else 2)
    main(args or ["mobilenet", "yolov8", "ultraface", "superres", "silero", "gtcrn",
                  *UNAVAILABLE])
