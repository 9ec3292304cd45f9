"""Helpers for the quantization tests: small real models, real inputs, calibration files.

The calibration files are produced here by running the float model in onnxruntime with
every float tensor exposed as an output (min/max over a few real inputs), in the
``qbuild-calibration`` version-1 format the ``quantize`` rule reads.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parents[2]
MNIST = REPO / "testdata" / "models" / "mnist.onnx"
MOBILENET = REPO / "testdata" / "models" / "mobilenet_v2_128_0.5.onnx"
IMAGES = REPO / "testdata" / "images"


def _init(name: str, array: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(array.astype(np.float32), name)


def conv_chain_model(opset: int = 13, seed: int = 0) -> onnx.ModelProto:
    """Conv->Relu->Conv->Relu->Conv chain whose intermediate tensors are graph outputs.

    ``hidden_output`` is a graph output consumed by two Convs, ``hidden_output_1`` a graph
    output consumed by one Conv; the names prefix each other and the final ``output``.
    """
    rng = np.random.default_rng(seed)

    def w(cout, cin, k):
        return rng.normal(0, 1 / np.sqrt(cin * k * k), (cout, cin, k, k)) * \
            rng.uniform(0.2, 3.0, (cout, 1, 1, 1))  # channel scales differ: per-channel matters

    inits = [
        _init("w1", w(8, 3, 3)), _init("b1", rng.normal(0, 0.1, 8)),
        _init("w2", w(8, 8, 3)), _init("b2", rng.normal(0, 0.1, 8)),
        _init("w3", w(4, 8, 3)), _init("b3", rng.normal(0, 0.1, 4)),
        _init("w4", w(4, 8, 1)), _init("b4", rng.normal(0, 0.1, 4)),
    ]
    pads = {"pads": [1, 1, 1, 1]}
    nodes = [
        helper.make_node("Conv", ["input", "w1", "b1"], ["c1"], "conv1", **pads),
        helper.make_node("Relu", ["c1"], ["hidden_output"], "relu1"),
        helper.make_node("Conv", ["hidden_output", "w2", "b2"], ["c2"], "conv2", **pads),
        helper.make_node("Relu", ["c2"], ["hidden_output_1"], "relu2"),
        helper.make_node("Conv", ["hidden_output_1", "w3", "b3"], ["c3"], "conv3", **pads),
        helper.make_node("Conv", ["hidden_output", "w4", "b4"], ["c4"], "conv4"),
        helper.make_node("Add", ["c3", "c4"], ["output"], "add"),
    ]
    graph = helper.make_graph(
        nodes, "conv_chain",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 4, 16, 16]),
         helper.make_tensor_value_info("hidden_output", TensorProto.FLOAT, [1, 8, 16, 16]),
         helper.make_tensor_value_info("hidden_output_1", TensorProto.FLOAT, [1, 8, 16, 16])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 7 if opset < 15 else 8
    onnx.checker.check_model(model, full_check=True)
    return model


def gemm_matmul_model(seed: int = 1) -> onnx.ModelProto:
    """Gemm (transB=1) -> Relu -> MatMul -> Add -> Gemm (transB=0), constant weights.

    The MatMul output ``hidden_output`` is also a graph output.
    """
    rng = np.random.default_rng(seed)
    scale = rng.uniform(0.2, 3.0, (1, 32))
    inits = [
        _init("gw1", rng.normal(0, 0.25, (32, 16)) * scale.T), _init("gb1", rng.normal(0, .1, 32)),
        _init("mw", rng.normal(0, 0.2, (32, 24)) * rng.uniform(0.2, 3.0, (1, 24))),
        _init("mb", rng.normal(0, 0.1, 24)),
        _init("gw2", rng.normal(0, 0.2, (24, 10)) * rng.uniform(0.2, 3.0, (1, 10))),
        _init("gb2", rng.normal(0, 0.1, 10)),
    ]
    nodes = [
        helper.make_node("Gemm", ["input", "gw1", "gb1"], ["g1"], "gemm1", transB=1),
        helper.make_node("Relu", ["g1"], ["r1"], "relu1"),
        helper.make_node("MatMul", ["r1", "mw"], ["hidden_output"], "matmul"),
        helper.make_node("Add", ["hidden_output", "mb"], ["a1"], "add"),
        helper.make_node("Gemm", ["a1", "gw2", "gb2"], ["output"], "gemm2"),
    ]
    graph = helper.make_graph(
        nodes, "gemm_matmul",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [4, 10]),
         helper.make_tensor_value_info("hidden_output", TensorProto.FLOAT, [4, 24])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 7
    onnx.checker.check_model(model, full_check=True)
    return model


def save(model: onnx.ModelProto, path: Path) -> Path:
    path.write_bytes(model.SerializeToString())
    return path


def random_inputs(model_path: Path, count: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """``count`` feeds of uniform [0, 1) data for the model's (single) input."""
    sess = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    inp = sess.get_inputs()[0]
    shape = [d if isinstance(d, int) else 1 for d in inp.shape]
    rng = np.random.default_rng(seed)
    return [{inp.name: rng.random(shape, dtype=np.float32)} for _ in range(count)]


def image_inputs(size: int = 128) -> list[dict[str, np.ndarray]]:
    """The testdata images as MobileNetV2 feeds: RGB, resized, scaled to [-1, 1], NCHW."""
    from PIL import Image

    feeds = []
    for path in sorted(p for p in IMAGES.iterdir() if p.suffix in (".jpg", ".png")):
        img = Image.open(path).convert("RGB").resize((size, size), Image.BILINEAR)
        x = np.asarray(img, np.float32).transpose(2, 0, 1)[None] / 127.5 - 1.0
        feeds.append({"input_1:0": x.astype(np.float32)})
    return feeds


def digit_inputs() -> list[dict[str, np.ndarray]]:
    """Ten 28x28 handwritten-style digits drawn with Pillow, as mnist feeds (0..255 range)."""
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.load_default(size=22)
    feeds = []
    for digit in range(10):
        img = Image.new("L", (28, 28), 0)
        ImageDraw.Draw(img).text((14, 14), str(digit), fill=255, font=font, anchor="mm")
        x = np.asarray(img, np.float32)[None, None]
        feeds.append({"Input3": x})
    return feeds


def float_tensor_names(model: onnx.ModelProto) -> list[str]:
    inferred = onnx.shape_inference.infer_shapes(model)
    inits = {i.name for i in model.graph.initializer}
    typed = {v.name: v.type.tensor_type.elem_type
             for v in list(inferred.graph.value_info) + list(inferred.graph.output)
             + list(inferred.graph.input)}
    names = [i.name for i in model.graph.input if i.name not in inits]
    names += [o for n in model.graph.node for o in n.output if typed.get(o) == TensorProto.FLOAT]
    return [n for n in dict.fromkeys(names) if typed.get(n) == TensorProto.FLOAT]


def write_calibration(model_path: Path, feeds: list[dict[str, np.ndarray]], out: Path,
                      method: str = "minmax") -> Path:
    """Run the float model on ``feeds`` and write min/max ranges as calibration.json."""
    model = onnx.load(str(model_path))
    names = float_tensor_names(model)
    inferred = onnx.shape_inference.infer_shapes(model)
    infos = {v.name: v for v in list(inferred.graph.value_info) + list(inferred.graph.output)}
    existing = {o.name for o in model.graph.output}
    for name in names:
        if name not in existing and name in infos:
            model.graph.output.append(infos[name])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    out_names = [o.name for o in sess.get_outputs()]
    lo: dict[str, float] = {}
    hi: dict[str, float] = {}
    for feed in feeds:
        values = dict(zip(out_names, sess.run(None, feed)))
        values.update(feed)
        for name in names:
            if name in values:
                v = values[name]
                lo[name] = min(lo.get(name, np.inf), float(v.min()))
                hi[name] = max(hi.get(name, -np.inf), float(v.max()))
    doc = {
        "format": "qbuild-calibration", "version": 1, "method": method, "options": {},
        "symmetric": False,
        "model_sha256": hashlib.sha256(Path(model_path).read_bytes()).hexdigest(),
        "dataset_sha256": "0" * 64, "num_samples": len(feeds),
        "libraries": {"onnxruntime": ort.__version__, "onnx": onnx.__version__},
        "tensors": {n: {"min": lo[n], "max": hi[n], "range": [lo[n], hi[n]]} for n in sorted(lo)},
    }
    out.write_text(json.dumps(doc, indent=1, sort_keys=True))
    return out


def run(model_path: Path, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    sess = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feed)))


def sqnr_db(ref: np.ndarray, test: np.ndarray) -> float:
    noise = np.sum((ref.astype(np.float64) - test) ** 2)
    signal = np.sum(ref.astype(np.float64) ** 2)
    return float(10 * np.log10(signal / max(noise, 1e-30)))


def initializers(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}


def conv_silu_model(opset: int = 13, seed: int = 2) -> onnx.ModelProto:
    """Conv -> SiLU (Sigmoid, Mul) -> Conv -> SiLU -> Add (residual) -> Conv, the block
    of YOLOX / YOLOv8 backbones: the nodes a placement puts Q/DQ around (or not)."""
    rng = np.random.default_rng(seed)

    def w(cout, cin, k):
        return rng.normal(0, 1 / np.sqrt(cin * k * k), (cout, cin, k, k)) * \
            rng.uniform(0.3, 2.0, (cout, 1, 1, 1))

    inits = [
        _init("w1", w(8, 3, 3)), _init("b1", rng.normal(0.5, 0.3, 8)),
        _init("w2", w(8, 8, 1)), _init("b2", rng.normal(0, 0.2, 8)),
        _init("w3", w(4, 8, 3)), _init("b3", rng.normal(0, 0.1, 4)),
    ]
    pads = {"pads": [1, 1, 1, 1]}
    nodes = [
        helper.make_node("Conv", ["input", "w1", "b1"], ["c1"], "conv1", **pads),
        helper.make_node("Sigmoid", ["c1"], ["s1"], "sigmoid1"),
        helper.make_node("Mul", ["c1", "s1"], ["silu1"], "mul1"),
        helper.make_node("Conv", ["silu1", "w2", "b2"], ["c2"], "conv2"),
        helper.make_node("Sigmoid", ["c2"], ["s2"], "sigmoid2"),
        helper.make_node("Mul", ["c2", "s2"], ["silu2"], "mul2"),
        helper.make_node("Add", ["silu1", "silu2"], ["res"], "add"),
        helper.make_node("Conv", ["res", "w3", "b3"], ["output"], "conv3", **pads),
    ]
    graph = helper.make_graph(
        nodes, "conv_silu",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 4, 16, 16])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 7
    onnx.checker.check_model(model, full_check=True)
    return model
