"""A generated model over 2 GB (weights in external data) through onnx_model,
quant_preprocess, calibrate, quantize and quantize_dynamic, with the peak memory of each
step.

The model (generated here, never committed; written block by block so the generator
itself stays small): x [1, D] -> (MatMul [D, D] -> Relu) x L -> y, float32 weights in
one external data file (D = 8192, L = 9: 2.25 GiB). Each target is built by its own
``qbuild build`` command after its dependencies (so each figure is one step), while a
sampler reads /proc every 50 ms and sums the resident set of the qbuild process and all
its descendants (the worker processes that run the actions); the figure is the largest
sum seen. The goal (issue 14, point 8): every step at most 1.5x the model's size.

Run from the repository root:  python bench/bench_large_model.py [--dim 8192 --layers 9]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

BUILD = """
[fp]
rule = "onnx_model"
src = "big.onnx"
data = ["big.onnx.data"]

[pre]
rule = "quant_preprocess"
model = ":fp"
external_data = true

[data]
rule = "numpy_dataset"
files = ["x.npy"]
mapping = { x = "x.npy" }

[calib]
rule = "calibrate"
model = ":pre"
dataset = ":data"

[q]
rule = "quantize"
model = ":pre"
calibration = ":calib"

[dyn]
rule = "quantize_dynamic"
model = ":pre"
"""


def generate(folder: Path, dim: int, layers: int) -> int:
    """Write big.onnx + big.onnx.data; return the data size in bytes."""
    from onnx import TensorProto, helper

    data = folder / "big.onnx.data"
    inits, nodes, offset, src = [], [], 0, "x"
    with open(data, "wb") as f:
        for i in range(layers):
            rng = np.random.default_rng(i)
            for _ in range(0, dim, 512):  # 512 rows at a time
                block = rng.standard_normal((512, dim), dtype=np.float32)
                block *= np.float32(1.0 / np.sqrt(dim))
                f.write(block.tobytes())
            t = TensorProto(name=f"w{i}", data_type=TensorProto.FLOAT, dims=[dim, dim],
                            data_location=TensorProto.EXTERNAL)
            for k, v in (("location", data.name), ("offset", str(offset)),
                         ("length", str(dim * dim * 4))):
                e = t.external_data.add()
                e.key, e.value = k, v
            offset += dim * dim * 4
            inits.append(t)
            nodes.append(helper.make_node("MatMul", [src, f"w{i}"], [f"m{i}"], name=f"mm{i}"))
            last = i == layers - 1
            nodes.append(helper.make_node("Relu", [f"m{i}"], ["y" if last else f"r{i}"],
                                          name=f"relu{i}"))
            src = f"r{i}"
    g = helper.make_graph(nodes, "big",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, dim])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, dim])],
                          inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    (folder / "big.onnx").write_bytes(m.SerializeToString())
    return offset


def _tree_rss(root: int) -> int:
    """Sum of VmRSS (bytes) of ``root`` and its descendants."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{d}/status") as f:
                kb = next((int(line.split()[1]) for line in f if line.startswith("VmRSS:")),
                          0)
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(d))
        rss[int(d)] = kb * 1024
    total, stack = 0, [root]
    while stack:
        p = stack.pop()
        total += rss.get(p, 0)
        stack += children.get(p, [])
    return total


def measure(ws: Path, target: str) -> tuple[float, int]:
    """(seconds, peak tree RSS in bytes) of building one target."""
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "qbuild", "build", f"//m:{target}", "-j",
                             "1"], cwd=ws, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    peak = [0]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], _tree_rss(proc.pid))
            time.sleep(0.05)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    out, err = proc.communicate()
    done.set()
    th.join()
    seconds = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"building {target} failed:\n{err[-4000:]}")
    return seconds, peak[0]


def main() -> None:
    import onnx
    import onnxruntime

    ap = argparse.ArgumentParser()
    ap.add_argument("--dim", type=int, default=8192)
    ap.add_argument("--layers", type=int, default=9)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--workdir", help="reuse (or keep) this folder: the generated model and "
                    "the cache survive, so --steps can re-measure some steps")
    ap.add_argument("--steps", default="fp,data,pre,calib,q,dyn")
    args = ap.parse_args()
    tmp = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(
        prefix="qbuild-bench-large-", dir=os.environ.get("TMPDIR")))
    try:
        ws = tmp / "ws"
        gen_s = 0.0
        if not (ws / "m" / "big.onnx").exists():
            (ws / "m").mkdir(parents=True, exist_ok=True)
            (ws / "qbuild.toml").write_text(f'[settings]\ncache_dir = "{tmp / "cache"}"\n')
            t = time.perf_counter()
            generate(ws / "m", args.dim, args.layers)
            gen_s = time.perf_counter() - t
            x = np.random.default_rng(0).standard_normal((4, 1, args.dim)).astype(np.float32)
            np.save(ws / "m" / "x.npy", x)
            (ws / "m" / "BUILD.toml").write_text(BUILD)
        size = (ws / "m" / "big.onnx.data").stat().st_size
        rows = []
        for target in args.steps.split(","):
            seconds, peak = measure(ws, target)
            rows.append((target, seconds, peak))
            print(f"{target}: {seconds:.1f} s, peak {peak / 2**30:.2f} GiB "
                  f"({peak / size:.2f}x)", file=sys.stderr, flush=True)
    finally:
        if not args.keep and not args.workdir:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"onnxruntime {onnxruntime.__version__}, onnx {onnx.__version__}, numpy "
          f"{np.__version__}, Python {sys.version.split()[0]}; model {size / 2**30:.2f} GiB "
          f"of weights ({args.layers} x [{args.dim}, {args.dim}] float32), generated in "
          f"{gen_s:.0f} s\n")
    print("| step | target | wall s | peak RSS (process tree) | × model size |")
    print("|---|---|---|---|---|")
    names = {"fp": "onnx_model", "data": "numpy_dataset", "pre": "quant_preprocess",
             "calib": "calibrate", "q": "quantize", "dyn": "quantize_dynamic"}
    for target, seconds, peak in rows:
        print(f"| {names[target]} | {target} | {seconds:.1f} | {peak / 2**30:.2f} GiB | "
              f"{peak / size:.2f} |")


if __name__ == "__main__":
    main()
