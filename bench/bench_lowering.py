"""Benchmark of integer lowering on YOLOX-Nano: onnxruntime CPU latency of the ort-mode
model against its QDQ source (1 thread and default threads), agreement of both modes with
the source (fixed_point with both roundings), share of nodes lowered, and the lowering
time itself (medians). Prints a
markdown table. Run from the repository root: python bench/bench_lowering.py [uint8|int8]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "plugins"))


def main(act: str = "uint8", runs: int = 30) -> None:
    import onnx
    from qbuild_lower.checking.compare import compare
    from qbuild_lower.lowering.driver import lower_model
    from qbuild_lower.qdq.source import image_batches, make_qdq
    from qbuild_onnx_common.ort import session

    images = sorted(
        p for p in (ROOT / "testdata" / "images").glob("*") if p.suffix in (".jpg", ".png")
    )
    tmp = Path(tempfile.mkdtemp())
    src_path = make_qdq(
        ROOT / "examples/yolo/yolox_nano.onnx",
        tmp / "yolox_qdq.onnx",
        image_batches(images[:4], (416, 416), "yolox"),
        act,
        scratch=tmp,
    )
    src = onnx.load(str(src_path))
    feeds = [{"images": x} for x in image_batches(images, (416, 416), "yolox")]
    rows = []
    models = {"qdq source": src}
    for mode, rounding in (("ort", "half_up"), ("fixed_point", "half_up"),
                           ("fixed_point", "onnxruntime")):
        times = []
        for _ in range(5):
            t = time.perf_counter()
            low, rep, _ = lower_model(src, mode, rounding)
            times.append(time.perf_counter() - t)
        label = mode if mode == "ort" else f"{mode}, rounding {rounding}"
        models[label] = low
        res = compare(src, low, feeds)
        rows.append(
            (
                label,
                rep["nodes"]["lowered"],
                rep["nodes"]["compute"],
                res["within_1lsb"],
                res["exact"],
                res["max_error_lsb"],
                statistics.median(times),
            )
        )
    # Interleaved: every round runs each model once, so load from other processes on a
    # shared machine hits all models alike (sequential medians drift more than the gap).
    lat = {}
    for threads in (1, 0):
        sessions = {name: session(m, threads) for name, m in models.items()}
        for s in sessions.values():
            for _ in range(3):
                s.run(None, feeds[0])
        ts = {name: [] for name in models}
        for k in range(runs):
            for name, s in sessions.items():
                t = time.perf_counter()
                s.run(None, feeds[k % len(feeds)])
                ts[name].append(time.perf_counter() - t)
        for name in models:
            lat[(name, threads)] = statistics.median(ts[name]) * 1e3
    print(f"YOLOX-Nano, {act} activations, {len(feeds)} images\n")
    print(
        "| mode | nodes lowered | within ±1 LSB | bit-exact | max LSB "
        "| lowering time (median of 5) |"
    )
    print("|---|---|---|---|---|---|")
    for mode, lo, tot, w, ex, mx, t in rows:
        print(
            f"| {mode} | {lo}/{tot} ({lo / tot:.1%}) | {w:.4%} | {ex:.4%} | {mx:g} "
            f"| {t * 1e3:.0f} ms |"
        )
    print("\n| model | 1 thread (ms, median) | default threads (ms, median) |")
    print("|---|---|---|")
    for name in models:
        print(f"| {name} | {lat[(name, 1)]:.1f} | {lat[(name, 0)]:.1f} |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "uint8")
