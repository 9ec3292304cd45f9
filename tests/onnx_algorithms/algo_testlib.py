"""Small generated models and helpers for the algorithm tests (real onnxruntime runs)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _model(nodes, inputs, outputs, inits, opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m, full_check=True)
    return m


def conv_chain(seed: int = 0):
    """Conv(3->8) -> Relu -> Conv 1x1 (8->8) -> Relu -> depthwise 3x3 -> Relu -> Conv(8->4),
    with output-channel ranges spread over 3 decades (what CLE is for)."""
    rng = np.random.default_rng(seed)
    spread = np.logspace(-1.5, 1.0, 8).astype(np.float32)
    w1 = rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * spread[:, None, None, None]
    w2 = rng.standard_normal((8, 8, 1, 1)).astype(np.float32) / spread[None, :, None, None]
    w2 *= spread[::-1, None, None, None] * 0.3
    w3 = rng.standard_normal((8, 1, 3, 3)).astype(np.float32) * spread[::-1, None, None, None]
    w4 = rng.standard_normal((4, 8, 1, 1)).astype(np.float32) * 0.2
    inits = [numpy_helper.from_array(a, n) for a, n in
             [(w1, "w1"), (w2, "w2"), (w3, "w3"), (w4, "w4"),
              (rng.standard_normal(8).astype(np.float32) * spread, "b1"),
              (np.zeros(8, np.float32), "b2"), (np.zeros(8, np.float32), "b3"),
              (np.zeros(4, np.float32), "b4")]]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2"),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("Conv", ["r2", "w3", "b3"], ["c3"], name="dw3", group=8,
                         pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c3"], ["r3"], name="relu3"),
        helper.make_node("Conv", ["r3", "w4", "b4"], ["y"], name="conv4"),
    ]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                        [1, 3, 16, 16])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 16, 16])],
                  inits)


def matmul_model(k: int = 64, n: int = 48, m: int = 32, layernorm: bool = True, seed: int = 0):
    """x [1, 16, k] -> (LayerNormalization) -> MatMul [k, n] -> Relu -> MatMul [n, m]."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32) * 0.2,
                                     "wa"),
             numpy_helper.from_array(rng.standard_normal((n, m)).astype(np.float32) * 0.2,
                                     "wb")]
    nodes = []
    src = "x"
    if layernorm:
        gamma = np.ones(k, np.float32)
        gamma[:3] = 40.0  # outlier channels, as in transformers
        inits += [numpy_helper.from_array(gamma, "gamma"),
                  numpy_helper.from_array(np.zeros(k, np.float32), "beta")]
        nodes.append(helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["ln"],
                                      name="ln", axis=-1))
        src = "ln"
    nodes += [helper.make_node("MatMul", [src, "wa"], ["h"], name="mm_a"),
              helper.make_node("Relu", ["h"], ["hr"], name="relu"),
              helper.make_node("MatMul", ["hr", "wb"], ["y"], name="mm_b")]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, k])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, m])], inits)


def outlier_inputs(k: int, count: int, seed: int) -> np.ndarray:
    """[count, 16, k] activations with a few channels 50x larger than the rest."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((count, 16, k)).astype(np.float32)
    x[..., :3] *= 50.0
    return x


def images(count: int, seed: int, shape=(3, 16, 16)) -> np.ndarray:
    rng = np.random.default_rng(seed)
    base = np.linspace(0, 1, int(np.prod(shape)), dtype=np.float32).reshape(shape)
    return np.stack([np.clip(base + 0.3 * rng.standard_normal(shape), 0, 1)
                     for _ in range(count)]).astype(np.float32)


def run(model: Path | bytes, feeds: list[dict]) -> list[np.ndarray]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    src = model if isinstance(model, bytes) else str(model)
    s = ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])
    return [s.run(None, f)[0] for f in feeds]


def sqnr_db(ref: list[np.ndarray], out: list[np.ndarray]) -> float:
    r = np.concatenate([a.ravel() for a in ref]).astype(np.float64)
    o = np.concatenate([a.ravel() for a in out]).astype(np.float64)
    return float(10 * np.log10((r * r).sum() / max(((r - o) ** 2).sum(), 1e-30)))
