"""Is the quantized model faster than its float source? For YOLOX-Nano, MobileNetV2,
UltraFace (slim-320) and the super-resolution model: the float model, its QDQ model
(onnxruntime quantize_static: per-channel int8 weights, uint8 activations, calibrated on
the test images) and that model lowered by ``lower_integer`` (mode ort, tables
"fastest" and "table"), all timed interleaved in one process (1 thread, warm-ups, median,
quartiles, spread; wall time and the runs' CPU time, which stays steady when other
processes load the machine) with the lowered models' bit-exactness against the QDQ
source, each model's MAC count and the op types that dominate its onnxruntime profile. With the YOLO
example built (qbuild build //examples/yolo:yolo_int8), its recipe model is measured too.
Models come from testdata/ and /work/shared/corpus (skipped when absent).
Run from the repository root: python bench/bench_speed.py [runs]
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "plugins"))
CORPUS = Path("/work/shared/corpus/models")
IMAGES = sorted(p for p in (ROOT / "testdata" / "images").glob("*")
                if p.suffix in (".jpg", ".png"))


def _prep(kind):
    import numpy as np

    return {
        "yolox": ((416, 416), "BGR", lambda a: a),
        "mobilenet": ((128, 128), "RGB", lambda a: a / 127.5 - 1.0),
        "ultraface": ((240, 320), "RGB", lambda a: (a - 127.0) / 128.0),
        "superres": ((224, 224), "Y", lambda a: a / 255.0),
    }[kind], np


def batches(kind, images):
    from PIL import Image

    (size, order, scale), np = _prep(kind)
    out = []
    for p in images:
        with Image.open(p) as im:
            im = im.convert("RGB").resize((size[1], size[0]), Image.BILINEAR)
            if order == "Y":
                a = np.asarray(im.convert("YCbCr"), np.float32)[:, :, :1]
            else:
                a = np.asarray(im, np.float32)
                a = a[:, :, ::-1] if order == "BGR" else a
        out.append(np.ascontiguousarray(scale(a).astype(np.float32).transpose(2, 0, 1)[None]))
    return out


def main(runs: int = 30) -> None:
    import onnx
    from qbuild_lower.checking.compare import compare
    from qbuild_lower.lowering.driver import lower_model
    from qbuild_lower.profiling.macs import macs
    from qbuild_lower.profiling.timing import conditions, interleaved_latency, op_profile
    from qbuild_lower.qdq.source import make_qdq

    tmp = Path(tempfile.mkdtemp())
    cases = [("YOLOX-Nano", ROOT / "examples/yolo/yolox_nano.onnx", "yolox"),
             ("MobileNetV2 0.5/128", ROOT / "testdata/models/mobilenet_v2_128_0.5.onnx",
              "mobilenet"),
             ("UltraFace slim-320", CORPUS / "ultraface/version-slim-320.onnx", "ultraface"),
             ("super-resolution", CORPUS / "super_resolution/pytorch_super_resolution.onnx",
              "superres")]
    print(json.dumps(conditions()))
    results = {}
    for name, path, kind in cases:
        if not path.exists():
            print(f"skip {name}: {path} missing")
            continue
        b = batches(kind, IMAGES)
        src = onnx.load(str(path))
        inp = src.graph.input[0].name
        qdq_path = make_qdq(path, tmp / f"{kind}_qdq.onnx", b[:4], "uint8", scratch=tmp)
        qdq = onnx.load(str(qdq_path))
        models = {"float": path, "QDQ": qdq_path}
        extra = {}
        recipe = ROOT / "qbuild-out/examples/yolo/@yolo_int8/yolo_int8.onnx"
        sources = {"QDQ": qdq}
        if kind == "yolox" and recipe.exists():
            models["recipe QDQ"] = recipe
            sources["recipe QDQ"] = onnx.load(str(recipe))
        feeds = [{inp: x} for x in b[4:6] or b[:2]]
        for sname, s in sources.items():
            for tables in ("fastest", "table"):
                low, rep, _ = lower_model(s, "ort", tables=tables)
                p = tmp / f"{kind}_{sname.replace(' ', '_')}_{tables}.onnx"
                onnx.save(low, str(p))
                label = f"{sname} lowered ({tables})"
                models[label] = p
                chk = compare(s, low, feeds)
                extra[label] = {"exact": chk["exact"], "max_lsb": chk["max_error_lsb"],
                                "regions": rep.get("regions", {}).get("by_form")}
        lat = interleaved_latency(models, feeds[0], threads=1, runs=runs, warmup=5,
                                  reference="float")
        prof = {}
        for label in ("float", "QDQ lowered (fastest)", "recipe QDQ lowered (fastest)"):
            if label in models:
                p = op_profile(models[label], feeds[0], threads=1, runs=5, top=3)
                # per op type the sum of each node's fastest run: the profiler times wall
                # time, and that sum is the estimate a loaded machine disturbs least
                ranked = sorted(p["op_types"].items(), key=lambda kv: -kv[1]["min_ms"])
                prof[label] = {"run_ms": p["run_ms"], "kernel_min_ms": p["kernel_min_ms"],
                               "top_op_types": {k: v["min_ms"] for k, v in ranked[:5]}}
        results[name] = {"macs": macs(src), "latency": lat, "checks": extra, "profile": prof}
        print(f"\n## {name}: {macs(src)['total'] / 1e6:.1f} M MACs")
        print("| model | wall median ms | q1-q3 | spread | wall speed-up | CPU ms (spread) "
              "| CPU speed-up | bit-exact vs source |")
        print("|---|---|---|---|---|---|---|---|")
        for label, m in lat["models"].items():
            c = extra.get(label)
            ex = f"{c['exact']:.2%} (max {c['max_lsb']} LSB)" if c else ""
            cpu = m["cpu"]
            print(f"| {label} | {m['median_ms']:.2f} | {m['q1_ms']:.2f}-{m['q3_ms']:.2f} | "
                  f"{m['spread']:.0%}{' noisy' if m['noisy'] else ''} | {m['speedup']}x"
                  f"{' SLOWER' if m['slower_than_reference'] else ''} | "
                  f"{cpu['median_ms']:.2f} ({cpu['spread']:.0%}) | {cpu['speedup']}x"
                  f"{' SLOWER' if cpu['slower_than_reference'] else ''} | {ex} |")
        for label, p in prof.items():
            print(f"profile {label}: kernels {p['kernel_min_ms']} ms (sum of each node's "
                  f"fastest run); top op types {p['top_op_types']}")
        sys.stdout.flush()
    print(json.dumps(conditions()))
    (tmp / "results.json").write_text(json.dumps(results, indent=1))
    print(f"raw results: {tmp / 'results.json'}")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:]))
