"""YOLOX-Nano quantization experiments (long-running; not a test).

Usage: python examples/yolo/experiments.py [variant ...]   (from the repository root)

Held out: dog.jpg and australia.jpg (evaluated with augmentations 0..7: 16 inputs).
Calibration: augmentations 0..7 of pineapple.jpg, super_res_input.png, test_colors.jpg,
wolves.jpg (32 inputs). Prints F1 vs the float model, output SQNR and 1-thread latency.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "plugins"))

from qbuild_onnx.accuracy import yolo as ay  # noqa: E402
from qbuild_onnx.accuracy.metrics import (  # noqa: E402
    compare_outputs,
    median_latency_ms,
    run_model,
)
from qbuild_onnx_common.ort import session  # noqa: E402

IMAGES = ROOT / "testdata" / "images"
CALIB = ["pineapple.jpg", "super_res_input.png", "test_colors.jpg", "wolves.jpg"]
EVAL = ["dog.jpg", "australia.jpg"]
AUGS = range(8)
WORK = Path("/tmp/yw")


def prepared_model() -> Path:
    out = WORK / "yolo_pre.onnx"
    if not out.exists():
        import onnx
        from onnx import version_converter
        from onnxruntime.quantization.shape_inference import quant_pre_process

        WORK.mkdir(parents=True, exist_ok=True)
        src = onnx.load(ROOT / "examples/yolo/yolox_nano.onnx")
        m13 = version_converter.convert_version(src, 13)
        onnx.save(m13, WORK / "yolo13.onnx")
        quant_pre_process(str(WORK / "yolo13.onnx"), str(out))
    return out


def feeds(names):
    return [{"images": x} for x in ay.image_inputs([IMAGES / n for n in names], AUGS)]


def evaluate(float_model, cand_model, eval_feeds, ref_outs=None, latency=True):
    if ref_outs is None:
        ref_outs = run_model(session(float_model), eval_feeds)
    cs = session(cand_model)
    cand_outs = run_model(cs, eval_feeds)
    f1 = ay.detection_f1([o["output"] for o in ref_outs], [o["output"] for o in cand_outs])
    err = compare_outputs(ref_outs, cand_outs)["output"]
    res = {"f1": round(f1["f1"], 4), "precision": round(f1["precision"], 4),
           "recall": round(f1["recall"], 4), "sqnr_db": err["sqnr_db"],
           "ref": f1["reference_detections"], "cand": f1["candidate_detections"]}
    if latency:
        res["latency_ms"] = round(median_latency_ms(cs, eval_feeds[0], runs=30), 2)
    return res


if __name__ == "__main__":
    from qbuild_onnx.accuracy.ortq import quantize_qdq

    pre = prepared_model()
    cf, ef = feeds(CALIB), feeds(EVAL)
    ref = run_model(session(pre), ef)
    variants = {
        "fp32": None,
        "u8_minmax": dict(activation_type="uint8"),
        "s8_minmax": dict(activation_type="int8"),
        "u8_percentile": dict(activation_type="uint8", method="percentile"),
        "u16_all": dict(activation_type="uint16"),
    }
    import onnx
    from qbuild_onnx.accuracy.bias_correction import bias_correct

    nodes = [n.name for n in onnx.load(pre).graph.node]
    stem = nodes[: nodes.index("Mul_75") + 1]  # Focus slices, stem and dark2 stay float
    variants["recipe_no_bc"] = dict(overrides={"nodes_to_exclude": stem})
    variants["recipe"] = dict(overrides={"nodes_to_exclude": stem}, bias_correction=True)
    u16 = {t: {"quant_type": "uint16"} for t in ("1213", "1225", "757")}
    variants["recipe_u16"] = dict(overrides={"nodes_to_exclude": stem, "tensors": u16},
                                  bias_correction=True)
    variants["u16_all_bc"] = dict(activation_type="uint16", bias_correction=True)
    todo = sys.argv[1:] or list(variants)
    for name in todo:
        kw = dict(variants[name] or {})
        bc = kw.pop("bias_correction", False)
        path = pre
        if variants[name] is not None:
            path = quantize_qdq(pre, WORK / f"{name}.onnx", cf, **kw)
        if bc:
            bias_correct(path, pre, cf, WORK / f"{name}_bc.onnx")
            path = WORK / f"{name}_bc.onnx"
        print(name, json.dumps(evaluate(pre, path, ef, ref)), flush=True)
