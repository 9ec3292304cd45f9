"""Per-element cost of the forms a 256-entry table of 8-bit codes can take in
onnxruntime (CPU, one thread), against the QDQ forms they replace. Each model maps a
[1, 52, 52, 64] uint8 tensor to uint8; all are timed interleaved in one process after
warm-ups; prints median ns per element, minimum and relative spread (IQR / median) of
each run's CPU time (one thread: onnxruntime computes on the calling thread, and CPU time
leaves out the time spent waiting for a core on a loaded machine).
These figures are the ``COSTS`` in plugins/qbuild_lower/patterns/fuse.py.

The second table (``kernels``) times single onnxruntime 8-bit element-wise kernels on
their own: each model chains the same op ``CHAIN`` times, so the graph's input/output
copies (about 0.15-0.2 ns per element in the first table) are shared by all of them, and
prints ns per element per op: QLinearMul in its variants (uint8/int8, same shape or
broadcast, output scale equal to the input's), QLinearAdd, the lookup kernels
(QLinearSigmoid, QLinearLeakyRelu), a copy (QLinearConcat of inputs sharing the output's
scale and zero point) against a requantizing QLinearConcat, and float Mul / QuickGelu.
Run from the repository root: python bench/bench_tables.py [rounds]
"""

from __future__ import annotations

import os
import statistics
import sys
import time

SHAPE = [1, 52, 52, 64]


def models():
    import numpy as np
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper as nh

    def mk(nodes, inits, itype=T.UINT8):
        g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", itype, SHAPE)],
                         [h.make_tensor_value_info("y", itype, None)], inits)
        return h.make_model(g, opset_imports=[h.make_opsetid("", 17),
                                              h.make_opsetid("com.microsoft", 1)],
                            ir_version=8)

    tab = nh.from_array(np.arange(256, dtype=np.uint8)[::-1].copy(), "tab")
    m1 = nh.from_array(np.array([-1], np.int64), "m1")
    shp = nh.from_array(np.array(SHAPE, np.int64), "shp")
    q = [nh.from_array(np.array(v, dt), n) for n, v, dt in (
        ("s", 0.05, np.float32), ("z", 128, np.uint8), ("s2", 1 / 256, np.float32),
        ("z2", 0, np.uint8))]

    def dq(i, o, s="s", z="z"):
        return h.make_node("DequantizeLinear", [i, s, z], [o])

    def qn(i, o, s="s", z="z"):
        return h.make_node("QuantizeLinear", [i, s, z], [o])

    return {
        "SiLU as QDQ (QLinearSigmoid + QLinearMul)": mk(
            [dq("x", "f"), h.make_node("Sigmoid", ["f"], ["g"]), qn("g", "gq", "s2", "z2"),
             dq("gq", "gd", "s2", "z2"), h.make_node("Mul", ["f", "gd"], ["m"]),
             qn("m", "y")], q),
        "SiLU island (DQ, float Sigmoid and Mul -> QuickGelu, Q)": mk(
            [dq("x", "f"), h.make_node("Sigmoid", ["f"], ["g"]),
             h.make_node("Mul", ["f", "g"], ["m"]), qn("m", "y")], q),
        "float SiLU alone (fused QuickGelu, float32 in and out)": mk(
            [h.make_node("Sigmoid", ["x"], ["g"]), h.make_node("Mul", ["x", "g"], ["y"])],
            [], T.FLOAT),
        "Sigmoid as QDQ (QLinearSigmoid: onnxruntime's own lookup)": mk(
            [dq("x", "f"), h.make_node("Sigmoid", ["f"], ["g"]), qn("g", "y", "s2", "z2")], q),
        "Tanh as QDQ (DQ, float Tanh, Q)": mk(
            [dq("x", "f"), h.make_node("Tanh", ["f"], ["g"]), qn("g", "y")], q),
        "HardSwish as QDQ (DQ, float HardSwish, Q)": mk(
            [dq("x", "f"), h.make_node("HardSwish", ["f"], ["g"]), qn("g", "y")], q),
        "table: Cast int32 + GatherElements": mk(
            [h.make_node("Cast", ["x"], ["i"], to=T.INT32),
             h.make_node("Reshape", ["i", "m1"], ["r"]),
             h.make_node("GatherElements", ["tab", "r"], ["g"], axis=0),
             h.make_node("Reshape", ["g", "shp"], ["y"])], [tab, m1, shp]),
        "table: Cast int64 + GatherElements": mk(
            [h.make_node("Cast", ["x"], ["i"], to=T.INT64),
             h.make_node("Reshape", ["i", "m1"], ["r"]),
             h.make_node("GatherElements", ["tab", "r"], ["g"], axis=0),
             h.make_node("Reshape", ["g", "shp"], ["y"])], [tab, m1, shp]),
        "table: Cast int32 + Gather": mk(
            [h.make_node("Cast", ["x"], ["i"], to=T.INT32),
             h.make_node("Gather", ["tab", "i"], ["y"], axis=0)], [tab]),
        "table: Cast int64 + Gather": mk(
            [h.make_node("Cast", ["x"], ["i"], to=T.INT64),
             h.make_node("Gather", ["tab", "i"], ["y"], axis=0)], [tab]),
    }


CHAIN = 8


def kernels():
    """{label: model}: one 8-bit element-wise kernel chained ``CHAIN`` times."""
    import numpy as np
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper as nh

    def consts(signed):
        z = np.int8 if signed else np.uint8
        vals = {"sx": (0.0407, np.float32), "zx": (12 if signed else 140, z),
                "ss": (0.00388, np.float32), "zs": (-128 if signed else 0, z),
                "sy": (0.01928, np.float32), "zy": (-114 if signed else 14, z),
                "b": (np.arange(SHAPE[-1]) % 256 - (128 if signed else 0), z),
                "one": (1 if signed else 129, z)}
        return [nh.from_array(np.array(v, dt), n) for n, (v, dt) in vals.items()]

    def chain(make, signed=False, itype=None, length=CHAIN):
        nodes, cur = [], "x"
        for i in range(length):
            out = "y" if i == length - 1 else f"t{i}"
            nodes.append(make(cur, out))
            cur = out
        t = itype or (T.INT8 if signed else T.UINT8)
        g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", t, SHAPE)],
                         [h.make_tensor_value_info("y", t, None)],
                         [] if itype == T.FLOAT else consts(signed))
        return h.make_model(g, opset_imports=[h.make_opsetid("", 17),
                                              h.make_opsetid("com.microsoft", 1)],
                            ir_version=8)

    def ms(op, ins, out, **kw):
        return h.make_node(op, ins, [out], domain="com.microsoft", **kw)

    out = {}
    for signed, tag in ((False, "uint8"), (True, "int8")):
        out[f"QLinearMul {tag}, same shape"] = chain(lambda i, o: ms(
            "QLinearMul", [i, "sx", "zx", i, "ss", "zs", "sx", "zx"], o), signed)
        out[f"QLinearSigmoid {tag} (lookup)"] = chain(lambda i, o: ms(
            "QLinearSigmoid", [i, "sx", "zx", "sy", "zy"], o), signed)
    out["QLinearMul uint8, output scale != input scale"] = chain(lambda i, o: ms(
        "QLinearMul", [i, "sx", "zx", i, "ss", "zs", "sy", "zy"], o))
    out["QLinearMul uint8, broadcast scalar B"] = chain(lambda i, o: ms(
        "QLinearMul", [i, "sx", "zx", "one", "ss", "zs", "sx", "zx"], o))
    out["QLinearMul uint8, broadcast per-channel B (NHWC, last axis)"] = chain(
        lambda i, o: ms("QLinearMul", [i, "sx", "zx", "b", "ss", "zs", "sx", "zx"], o))
    out["QLinearAdd uint8, same shape"] = chain(lambda i, o: ms(
        "QLinearAdd", [i, "sx", "zx", i, "ss", "zs", "sx", "zx"], o))
    out["QLinearLeakyRelu uint8 (lookup)"] = chain(lambda i, o: ms(
        "QLinearLeakyRelu", [i, "sx", "zx", "sy", "zy"], o, alpha=0.1))
    # a Concat doubles its input: not chained (one op, its graph I/O included; the
    # figure is per output element and comparable only among the Concats)
    out["concat: QLinearConcat uint8 on channels (NHWC), inputs requantized (lookup)"] = chain(
        lambda i, o: ms("QLinearConcat", ["sy", "zy", i, "sx", "zx", i, "ss", "zs"], o,
                        axis=-1), length=1)
    out["concat: QLinearConcat uint8 on channels (NHWC), inputs sharing the output's "
        "scale (copy)"] = chain(lambda i, o: ms(
            "QLinearConcat", ["sx", "zx", i, "sx", "zx", i, "sx", "zx"], o, axis=-1),
            length=1)
    out["concat: Concat uint8 on channels (NHWC, plain)"] = chain(
        lambda i, o: h.make_node("Concat", [i, i], [o], axis=-1), length=1)
    out["float Mul"] = chain(lambda i, o: h.make_node("Mul", [i, i], [o]), itype=T.FLOAT)
    out["float QuickGelu (SiLU)"] = chain(lambda i, o: ms("QuickGelu", [i], o, alpha=1.0),
                                          itype=T.FLOAT)
    return out


def _time(models, feeds, rounds):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    sess = {k: ort.InferenceSession(m.SerializeToString(), so,
                                    providers=["CPUExecutionProvider"])
            for k, m in models.items()}
    names = list(sess)
    times = {k: [] for k in names}
    for r in range(rounds + 5):
        k0 = r % len(names)
        for k in names[k0:] + names[:k0]:
            t = time.thread_time()
            sess[k].run(None, {"x": feeds(k)})
            if r >= 5:
                times[k].append(time.thread_time() - t)
    return times


def _kernel_table(rounds):
    import numpy as np

    rng = np.random.default_rng(0)
    u8 = rng.integers(0, 256, SHAPE).astype(np.uint8)
    s8 = (u8.astype(np.int16) - 128).astype(np.int8)
    f32 = (u8.astype(np.float32) - 128) * 0.05

    def feed(k):
        return f32 if k.startswith("float") else (s8 if " int8" in k else u8)

    models = kernels()
    times = _time(models, feed, rounds)
    print(f"\n### Kernels (each op chained {CHAIN} times, ns per element per op; CPU "
          "time)\n")
    print("| kernel | median ns/element/op | min | spread |\n|---|---|---|---|")
    for k, v in times.items():
        n = int(np.prod(SHAPE)) * (2 if k.startswith("concat") else CHAIN)
        med = statistics.median(v)
        q = statistics.quantiles(v, n=4)
        print(f"| {k} | {med / n * 1e9:.3f} | {min(v) / n * 1e9:.3f} | "
              f"{(q[2] - q[0]) / med:.0%} |")


def main(rounds: int = 60) -> None:
    import numpy as np
    import onnxruntime as ort

    x = np.random.default_rng(0).integers(0, 256, SHAPE).astype(np.uint8)
    xf = (x.astype(np.float32) - 128) * 0.05
    n = x.size
    times = _time(models(), lambda k: xf if k.startswith("float") else x, rounds)
    names = list(times)
    print(f"onnxruntime {ort.__version__}, 1 thread, {rounds} interleaved rounds, "
          f"{SHAPE} uint8, CPU time; load average {os.getloadavg()}\n")
    print("| form | median ns/element | min | spread |\n|---|---|---|---|")
    for k in names:
        v = times[k]
        med = statistics.median(v)
        q = statistics.quantiles(v, n=4)
        print(f"| {k} | {med / n * 1e9:.2f} | {min(v) / n * 1e9:.2f} | "
              f"{(q[2] - q[0]) / med:.0%} |")
    _kernel_table(rounds)
    print(f"\nload average after: {os.getloadavg()}")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:]))
