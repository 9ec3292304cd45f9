"""Generates testdata/models/yolov8_tiny.onnx: a small YOLOv8-style detector built with
onnx.helper and seeded numpy weights (no third-party weights).

Layout as in Ultralytics YOLOv8 exports: input images [1, 3, 640, 640] (RGB, 0..1), one
output [1, 84, 8400] = 4 box values (cx, cy, w, h) in input pixels, then 80 class
probabilities (sigmoid), no objectness, anchors of the strides 8, 16, 32 in that order.
The network is a real convolutional net (Conv + SiLU stem and stages, one head per
stride), so its boxes span 0..640 while its scores span 0..1: the final Concat joins
tensors whose ranges differ by about 600x, the case that makes one shared 8-bit scale
round every score to zero.

Run: python testdata/generators/make_yolov8_tiny.py [out.onnx]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SIZE = 640
CLASSES = 80
STRIDES = (8, 16, 32)


def build(seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    nodes, inits = [], []

    def const(name, array):
        inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def conv(x, cin, cout, k, s, name, act=True, bias=None, gain=1.0):
        w = rng.normal(0, gain * np.sqrt(2.0 / (cin * k * k)), (cout, cin, k, k))
        b = np.zeros(cout) if bias is None else bias
        const(f"{name}.w", w.astype(np.float32))
        const(f"{name}.b", np.asarray(b, np.float32))
        nodes.append(helper.make_node("Conv", [x, f"{name}.w", f"{name}.b"], [f"{name}.y"],
                                      name=f"{name}/Conv", kernel_shape=[k, k],
                                      strides=[s, s], pads=[k // 2] * 4))
        if not act:
            return f"{name}.y"
        nodes.append(helper.make_node("Sigmoid", [f"{name}.y"], [f"{name}.sig"],
                                      name=f"{name}/Sigmoid"))
        nodes.append(helper.make_node("Mul", [f"{name}.y", f"{name}.sig"], [f"{name}.out"],
                                      name=f"{name}/Mul"))
        return f"{name}.out"

    x = conv("images", 3, 8, 3, 2, "stem")                   # /2
    x = conv(x, 8, 16, 3, 2, "stage1")                       # /4
    p3 = conv(x, 16, 24, 3, 2, "stage2")                     # /8
    p4 = conv(p3, 24, 32, 3, 2, "stage3")                    # /16
    p5 = conv(p4, 32, 48, 3, 2, "stage4")                    # /32
    boxes, scores = [], []
    for i, (feat, cin, stride) in enumerate(zip((p3, p4, p5), (24, 32, 48), STRIDES)):
        n = SIZE // stride
        h = conv(feat, cin, 32, 3, 1, f"head{i}")
        reg = conv(h, 32, 4, 1, 1, f"head{i}.box", act=False, gain=0.5)
        cls = conv(h, 32, CLASSES, 1, 1, f"head{i}.cls", act=False, gain=2.0,
                   bias=np.full(CLASSES, -5.0))
        shape = const(f"head{i}.shape", np.array([1, -1, n * n], np.int64))
        nodes.append(helper.make_node("Reshape", [reg, shape], [f"head{i}.reg_flat"],
                                      name=f"head{i}/Reshape_box"))
        nodes.append(helper.make_node("Reshape", [cls, shape], [f"head{i}.cls_flat"],
                                      name=f"head{i}/Reshape_cls"))
        # box = ((sigmoid(xy) * 2 - 0.5 + grid) * stride, exp(wh) * 4 * stride): pixels
        gx, gy = np.meshgrid(np.arange(n), np.arange(n))
        grid = np.stack([gx.ravel(), gy.ravel()]).astype(np.float32)[None]  # 1×2×A
        const(f"head{i}.grid", grid)
        const(f"head{i}.stride", np.array(stride, np.float32))
        const(f"head{i}.two", np.array(2.0, np.float32))
        const(f"head{i}.half", np.array(0.5, np.float32))
        const(f"head{i}.wh_scale", np.array(4.0 * stride, np.float32))
        const(f"head{i}.split", np.array([2, 2], np.int64))
        p = f"head{i}"
        nodes += [
            helper.make_node("Split", [f"{p}.reg_flat", f"{p}.split"], [f"{p}.xy", f"{p}.wh"],
                             name=f"{p}/Split", axis=1),
            helper.make_node("Sigmoid", [f"{p}.xy"], [f"{p}.xy_sig"], name=f"{p}/Sigmoid_xy"),
            helper.make_node("Mul", [f"{p}.xy_sig", f"{p}.two"], [f"{p}.xy2"], name=f"{p}/Mul_xy"),
            helper.make_node("Sub", [f"{p}.xy2", f"{p}.half"], [f"{p}.xy3"], name=f"{p}/Sub_xy"),
            helper.make_node("Add", [f"{p}.xy3", f"{p}.grid"], [f"{p}.xy4"], name=f"{p}/Add_grid"),
            helper.make_node("Mul", [f"{p}.xy4", f"{p}.stride"], [f"{p}.cxy"],
                             name=f"{p}/Mul_stride"),
            helper.make_node("Exp", [f"{p}.wh"], [f"{p}.wh_exp"], name=f"{p}/Exp_wh"),
            helper.make_node("Mul", [f"{p}.wh_exp", f"{p}.wh_scale"], [f"{p}.pwh"],
                             name=f"{p}/Mul_wh"),
            helper.make_node("Concat", [f"{p}.cxy", f"{p}.pwh"], [f"{p}.box"],
                             name=f"{p}/Concat_box", axis=1),
            helper.make_node("Sigmoid", [f"{p}.cls_flat"], [f"{p}.score"],
                             name=f"{p}/Sigmoid_cls"),
        ]
        boxes.append(f"{p}.box")
        scores.append(f"{p}.score")
    nodes.append(helper.make_node("Concat", boxes, ["boxes"], name="/model.22/Concat_boxes",
                                  axis=2))
    nodes.append(helper.make_node("Concat", scores, ["scores"], name="/model.22/Concat_scores",
                                  axis=2))
    nodes.append(helper.make_node("Concat", ["boxes", "scores"], ["output0"],
                                  name="/model.22/Concat_out", axis=1))
    anchors = sum((SIZE // s) ** 2 for s in STRIDES)
    graph = helper.make_graph(
        nodes, "yolov8_tiny",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, SIZE, SIZE])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, [1, 4 + CLASSES, anchors])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="qbuild-testdata")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else \
        Path(__file__).resolve().parents[1] / "models" / "yolov8_tiny.onnx"
    onnx.save(build(), str(out))
    print(out, out.stat().st_size)
