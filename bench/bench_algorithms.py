"""Each algorithm of qbuild_onnx.algorithms against what it replaces, on real models.

For every model a throw-away workspace is built through the real ``qbuild`` command:
the float model, onnxruntime's pre-processing, calibration images (testdata/images'
four calibration images, augmented) and held-out evaluation images (the other two,
augmented with another seed; never used to calibrate or to fit anything), then

* ``base_pt`` / ``base_pc``: plain ``quantize`` (uint8 activations, MinMax), per-tensor /
  per-channel int8 weights;
* ``cle_pt`` / ``cle_pc``: ``equalize`` (CLE, clip = "relu") -> calibrate -> quantize,
  same settings;
* ``ar_pc``: ``adaround`` of ``base_pc`` (defaults); ``bc_pc``: ``bias_correction`` of
  ``base_pc`` (the existing algorithm, for comparison);

each evaluated against the original float model on the evaluation images (``evaluate``:
worst-output SQNR and the model's task metric). For MatMul models (Silero VAD's
transformer, fed chunks of testdata's speech clip) ``sq_pc`` is ``equalize`` with
method = "smoothquant" (alpha 0.5) -> calibrate -> quantize against ``base_pc``. The
int4 section quantizes a generated MatMul model (K = 1024) with RTN and GPTQ through
``quantize_weights_int4``. Prints markdown tables and the wall time of each target.

Run from the repository root:  python bench/bench_algorithms.py [mobilenet sr yolox silero int4]
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
import wave
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ROOT / "testdata" / "images"
CORPUS = ROOT.parent / "shared" / "corpus"
CAL = ["pineapple.jpg", "super_res_input.png", "test_colors.jpg", "wolves.jpg"]
EVAL = ["dog.jpg", "australia.jpg"]

IMAGE_MODELS = {
    "mobilenet": dict(src=ROOT / "testdata/models/mobilenet_v2_128_0.5.onnx",
                      input="input_1:0", size=[128, 128],
                      extra="scale = 0.00784313725490196\nmean = [1.0]",
                      task="classification", metric="top1_agreement"),
    "sr": dict(src=CORPUS / "models/super_resolution/pytorch_super_resolution.onnx",
               input="input", size=[224, 224], extra='color = "GRAY"', task="sqnr",
               metric=None),
    "yolox": dict(src=ROOT / "examples/yolo/yolox_nano.onnx", input="images",
                  size=[416, 416], extra='resize = "letterbox"\nalign = "topleft"\n'
                  'color = "BGR"\nscale = 1.0', task="yolo", metric="f1"),
}

HEAD = """
[fp]
rule = "onnx_model"
src = "model.onnx"

[pre]
rule = "quant_preprocess"
model = ":fp"
"""

IMAGES_BUILD = """
[cal_data]
rule = "image_dataset"
images = ["cal/*"]
input = "{input}"
size = {size}
count = 16
{extra}

[ev_data]
rule = "image_dataset"
images = ["ev/*"]
input = "{input}"
size = {size}
count = 16
seed = 7
{extra}
"""

VARIANTS = """
[calib]
rule = "calibrate"
model = ":pre"
dataset = ":cal_data"

[base_pt]
rule = "quantize"
model = ":pre"
calibration = ":calib"
per_channel = false

[base_pc]
rule = "quantize"
model = ":pre"
calibration = ":calib"

[cle]
rule = "equalize"
model = ":pre"
clip = "relu"

[calib_cle]
rule = "calibrate"
model = ":cle"
dataset = ":cal_data"

[cle_pt]
rule = "quantize"
model = ":cle"
calibration = ":calib_cle"
per_channel = false

[cle_pc]
rule = "quantize"
model = ":cle"
calibration = ":calib_cle"

[ar_pc]
rule = "adaround"
model = ":base_pc"
reference = ":pre"
dataset = ":cal_data"

[bc_pc]
rule = "bias_correction"
model = ":base_pc"
reference = ":pre"
dataset = ":cal_data"
"""

SMOOTH = """
[calib]
rule = "calibrate"
model = ":pre"
dataset = ":cal_data"

[base_pc]
rule = "quantize"
model = ":pre"
calibration = ":calib"

[sq]
rule = "equalize"
model = ":pre"
method = "smoothquant"
dataset = ":cal_data"

[calib_sq]
rule = "calibrate"
model = ":sq"
dataset = ":cal_data"

[sq_pc]
rule = "quantize"
model = ":sq"
calibration = ":calib_sq"

[ar_pc]
rule = "adaround"
model = ":base_pc"
reference = ":pre"
dataset = ":cal_data"
"""

EVAL_T = """
[ev_{v}]
rule = "evaluate"
models = [":{v}"]
reference = ":pre"
dataset = ":ev_data"
task = "{task}"
latency_runs = 0
"""


def _qbuild(ws: Path, *args: str) -> tuple[float, str]:
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "qbuild", *args], cwd=ws, capture_output=True,
                       text=True)
    if r.returncode != 0:
        raise SystemExit(f"qbuild {' '.join(args)} failed:\n{r.stderr[-3000:]}")
    return time.perf_counter() - t, r.stderr


def _workspace(tmp: Path, name: str) -> Path:
    ws = tmp / name
    (ws / "m").mkdir(parents=True)
    (ws / "qbuild.toml").write_text(f'[settings]\ncache_dir = "{tmp / "cache"}"\n')
    return ws


def _timed_build(ws: Path, targets: list[str]) -> dict[str, float]:
    """Build one target at a time (after its dependencies) to time each on its own."""
    times = {}
    for t in targets:
        times[t], _ = _qbuild(ws, "build", f"//m:{t}", "-j", "1")
    # qbuild-out holds the last build's targets: bring them all back (cache hits)
    _qbuild(ws, "build", *[f"//m:{t}" for t in targets], "-j", "1")
    return times


def _entry(ws: Path, v: str) -> dict:
    rep = json.loads((ws / "qbuild-out" / "m" / f"@ev_{v}" / "report.json").read_text())
    return rep["models"][f"//m:{v}"]


def _row(ws: Path, v: str, metric: str | None) -> dict:
    e = _entry(ws, v)
    sq = min(o["sqnr_db"] for o in e["outputs"].values())
    task = (e.get("task") or {}).get(metric) if metric else None
    return {"variant": v, "sqnr_db": round(sq, 2), "metric": task}


def bench_images(name: str, tmp: Path) -> list[dict]:
    spec = IMAGE_MODELS[name]
    ws = _workspace(tmp, name)
    (ws / "m" / "cal").mkdir()
    (ws / "m" / "ev").mkdir()
    shutil.copyfile(spec["src"], ws / "m" / "model.onnx")
    for f in CAL:
        shutil.copyfile(IMAGES / f, ws / "m" / "cal" / f)
    for f in EVAL:
        shutil.copyfile(IMAGES / f, ws / "m" / "ev" / f)
    variants = ["base_pt", "cle_pt", "base_pc", "cle_pc", "bc_pc", "ar_pc"]
    build = HEAD + IMAGES_BUILD.format(**spec) + VARIANTS + "".join(
        EVAL_T.format(v=v, task=spec["task"]) for v in variants)
    (ws / "m" / "BUILD.toml").write_text(build)
    times = _timed_build(ws, ["pre", "cal_data", "ev_data", "calib", "cle", "calib_cle",
                              *variants, *[f"ev_{v}" for v in variants]])
    cle = json.loads((ws / "qbuild-out" / "m" / "@cle" / "report.json").read_text())
    rows = [_row(ws, v, spec["metric"]) for v in variants]
    for r in rows:
        r["seconds"] = round(times[r["variant"]], 1)
    rows.append({"variant": "cle pairs", "sqnr_db": cle["pairs"],
                 "metric": len(cle["clips_replaced_by_relu"]),
                 "seconds": round(times["cle"], 1)})
    return rows


def _speech_chunks(count: int, offset: int, seq: int = 1536) -> np.ndarray:
    with wave.open(str(CORPUS / "audio" / "silero_test.wav")) as w:
        a = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16)
        if w.getnchannels() > 1:
            a = a[::w.getnchannels()]
    a = a.astype(np.float32) / 32768.0
    starts = np.linspace(offset, len(a) - seq - 1, count).astype(int)
    return np.stack([a[s:s + seq][None] for s in starts]).astype(np.float32)


def bench_silero(tmp: Path) -> list[dict]:
    ws = _workspace(tmp, "silero")
    shutil.copyfile(ROOT / "testdata/models/silero_vad_v3.1_transformer.onnx",
                    ws / "m" / "model.onnx")
    for split, count, off in (("cal", 16, 0), ("ev", 16, 800)):
        np.save(ws / "m" / f"{split}_input.npy", _speech_chunks(count, off))
        np.save(ws / "m" / f"{split}_state.npy", np.zeros((count, 2, 1, 64), np.float32))
    data = "".join(f"""
[{s}_data]
rule = "numpy_dataset"
files = ["{s}_input.npy", "{s}_state.npy"]
mapping = {{ input = "{s}_input.npy", h0 = "{s}_state.npy", c0 = "{s}_state.npy" }}
""" for s in ("cal", "ev"))
    variants = ["base_pc", "sq_pc", "ar_pc"]
    build = HEAD + data + SMOOTH + "".join(EVAL_T.format(v=v, task="sqnr") for v in variants)
    (ws / "m" / "BUILD.toml").write_text(build)
    times = _timed_build(ws, ["pre", "cal_data", "ev_data", "calib", "sq", "calib_sq",
                              *variants, *[f"ev_{v}" for v in variants]])
    sq = json.loads((ws / "qbuild-out" / "m" / "@sq" / "report.json").read_text())
    rows = [_row(ws, v, None) for v in variants]
    for r in rows:
        r["seconds"] = round(times[r["variant"]], 1)
    rows.append({"variant": "smoothed activations", "sqnr_db": sq["smoothed"],
                 "metric": sq["folded"], "seconds": round(times["sq"], 1)})
    return rows


def bench_int4(tmp: Path) -> list[dict]:
    import onnx
    import onnxruntime as ort

    sys.path.insert(0, str(ROOT / "tests" / "onnx_algorithms"))
    import algo_testlib as lib

    ws = _workspace(tmp, "int4")
    model = lib.matmul_model(k=1024, n=1024, m=512, layernorm=False)
    onnx.save(model, str(ws / "m" / "model.onnx"))
    rng = np.random.default_rng(0)
    # correlated activations (low-rank structure plus noise), as real layers see them
    basis = rng.standard_normal((32, 1024)).astype(np.float32)
    def acts(n):
        return (rng.standard_normal((n, 1, 16, 32)).astype(np.float32) @ basis
                + 0.1 * rng.standard_normal((n, 1, 16, 1024)).astype(np.float32))
    np.save(ws / "m" / "cal.npy", acts(16))
    ev = acts(16)
    np.save(ws / "m" / "ev.npy", ev)
    build = """
[fp]
rule = "onnx_model"
src = "model.onnx"

[cal]
rule = "numpy_dataset"
files = ["cal.npy"]
mapping = { x = "cal.npy" }
"""
    variants = {"rtn_b32": 'block_size = 32', "rtn_b128": 'block_size = 128',
                "gptq_b32": 'algorithm = "gptq"\nblock_size = 32\ndataset = ":cal"',
                "gptq_b128": 'algorithm = "gptq"\nblock_size = 128\ndataset = ":cal"'}
    for v, extra in variants.items():
        build += f'\n[{v}]\nrule = "quantize_weights_int4"\nmodel = ":fp"\n{extra}\n'
    (ws / "m" / "BUILD.toml").write_text(build)
    times = _timed_build(ws, ["fp", "cal", *variants])
    feeds = [{"x": e} for e in ev]

    def run(path):
        s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return [s.run(None, f)[0] for f in feeds]

    ref = run(ws / "m" / "model.onnx")
    rows = []
    for v in variants:
        out = run(ws / "qbuild-out" / "m" / f"@{v}" / f"{v}.onnx")
        rows.append({"variant": v, "sqnr_db": round(lib.sqnr_db(ref, out), 2),
                     "metric": (ws / "qbuild-out" / "m" / f"@{v}" / f"{v}.onnx").stat().st_size
                     // 1024, "seconds": round(times[v], 1)})
    rows.append({"variant": "float", "sqnr_db": None,
                 "metric": (ws / "m" / "model.onnx").stat().st_size // 1024, "seconds": None})
    return rows


def main(names: list[str]) -> None:
    import onnx
    import onnxruntime

    tmp = Path(tempfile.mkdtemp(prefix="qbuild-bench-algos-"))
    out = {}
    try:
        for name in names:
            t = time.perf_counter()
            if name in IMAGE_MODELS:
                out[name] = bench_images(name, tmp)
            elif name == "silero":
                out[name] = bench_silero(tmp)
            elif name == "int4":
                out[name] = bench_int4(tmp)
            print(json.dumps({name: out[name], "total_s": round(time.perf_counter() - t)}),
                  file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"onnxruntime {onnxruntime.__version__}, onnx {onnx.__version__}, numpy "
          f"{np.__version__}, Python {sys.version.split()[0]}")
    for name, rows in out.items():
        print(f"\n### {name}\n\n| variant | worst-output SQNR dB | metric | build s |\n"
              "|---|---|---|---|")
        for r in rows:
            print(f"| {r['variant']} | {r['sqnr_db']} | {r['metric']} | {r['seconds']} |")


if __name__ == "__main__":
    main(sys.argv[1:] or ["mobilenet", "sr", "silero", "int4", "yolox"])
