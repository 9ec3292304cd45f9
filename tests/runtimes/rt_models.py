"""Small real models for the runtime-target tests (a uniquely named module): a tiny
float CNN with a dynamic batch, and a CSP block (YOLOX's pattern: two branches of
convolutions concatenated and read by a 1x1 convolution), which OpenVINO 2026.4 computes
wrongly once its activations are signed int8."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "testdata" / "models"


def _model(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto], x: list[object],
           y: str, y_shape: list[object]) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                          x)],
                              [helper.make_tensor_value_info(y, TensorProto.FLOAT, y_shape)],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


class _Builder:
    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def conv(self, x: str, ci: int, co: int, k: int, name: str, act: str = "silu") -> str:
        w = (self.rng.normal(0, 1, (co, ci, k, k)) / np.sqrt(ci * k * k)).astype(np.float32)
        b = self.rng.normal(0, 0.3, co).astype(np.float32)
        self.inits += [numpy_helper.from_array(w, f"{name}_w"),
                       numpy_helper.from_array(b, f"{name}_b")]
        self.nodes.append(helper.make_node("Conv", [x, f"{name}_w", f"{name}_b"], [name],
                                           pads=[k // 2] * 4, name=name))
        if act == "silu":
            self.nodes += [helper.make_node("Sigmoid", [name], [f"{name}_s"]),
                           helper.make_node("Mul", [name, f"{name}_s"], [f"{name}_a"])]
            return f"{name}_a"
        if act == "relu":
            self.nodes.append(helper.make_node("Relu", [name], [f"{name}_a"]))
            return f"{name}_a"
        return name


def tiny_cnn(seed: int = 0) -> onnx.ModelProto:
    """x [N, 3, 16, 16] -> Conv-Relu -> Conv -> y [N, 4, 16, 16]."""
    b = _Builder(seed)
    h = b.conv("x", 3, 8, 3, "c0", "relu")
    y = b.conv(h, 8, 4, 3, "c1", "none")
    return _model(b.nodes, b.inits, ["N", 3, 16, 16], y, ["N", 4, 16, 16])


def csp_block(seed: int = 1) -> onnx.ModelProto:
    """x [1, 3, 32, 32] -> stem -> (1x1 -> 3x3) and (1x1) -> Concat -> 1x1 -> head y."""
    b = _Builder(seed)
    s = b.conv("x", 3, 16, 3, "stem")
    a = b.conv(b.conv(s, 16, 16, 1, "a1"), 16, 16, 3, "a2")
    c = b.conv(s, 16, 16, 1, "b1")
    b.nodes.append(helper.make_node("Concat", [a, c], ["cat"], axis=1, name="cat"))
    y = b.conv(b.conv("cat", 32, 16, 1, "post"), 16, 4, 1, "head", "none")
    return _model(b.nodes, b.inits, [1, 3, 32, 32], y, [1, 4, 32, 32])


def images(seed: int, n: int, shape: tuple[int, ...] = (3, 32, 32)) -> np.ndarray:
    """``n`` seeded N(0, 1) inputs as one [n, *shape] float32 array."""
    return np.random.default_rng(seed).normal(0, 1, (n, *shape)).astype(np.float32)
