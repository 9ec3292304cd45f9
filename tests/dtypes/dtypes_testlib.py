"""Helpers for the dtype plugin's tests: ONNX node-test cases, running a model in onnxruntime
(sub-byte and float8 tensors fed through OrtValue, exotic outputs read back through a Cast)
and in onnx's reference evaluator, and making QDQ models with onnxruntime's quantize_static
from a few real images."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.helper as H
from onnx import TensorProto as T
from onnx import numpy_helper as nh

ROOT = Path(__file__).resolve().parents[2]
NODE_TESTS = ROOT / "testdata" / "onnx_node_tests"
IMAGES = sorted(p for p in (ROOT / "testdata" / "images").glob("*")
                if p.suffix.lower() in (".jpg", ".png"))
MODELS = ROOT / "testdata" / "models"
YOLO = ROOT / "examples" / "yolo" / "yolox_nano.onnx"

SUB_BYTE = {T.INT4: 4, T.UINT4: 4, T.INT2: 2, T.UINT2: 2}
EXOTIC = set(SUB_BYTE) | {T.FLOAT8E4M3FN, T.FLOAT8E4M3FNUZ, T.FLOAT8E5M2, T.FLOAT8E5M2FNUZ,
                          T.FLOAT4E2M1}


def qdq_cases() -> list[str]:
    return sorted(p.name for p in NODE_TESTS.iterdir()
                  if p.name.startswith(("test_quantizelinear", "test_dequantizelinear")))


def load_case(name: str):
    d = NODE_TESTS / name
    model = onnx.load(str(d / "model.onnx"))
    ds = d / "test_data_set_0"
    ins = [onnx.load_tensor(str(ds / f"input_{i}.pb"))
           for i in range(len(list(ds.glob("input_*.pb"))))]
    outs = [onnx.load_tensor(str(ds / f"output_{i}.pb"))
            for i in range(len(list(ds.glob("output_*.pb"))))]
    return model, ins, outs


def as_float(t: onnx.TensorProto) -> np.ndarray:
    """A tensor's values as float64 (quantized types decoded by the plugin's own reader
    is avoided here on purpose: onnx's numpy_helper is the independent oracle)."""
    return np.asarray(nh.to_array(t)).astype(np.float64)


def _ort_value(t: onnx.TensorProto):
    import onnxruntime as ort

    if t.data_type in SUB_BYTE:
        bits = SUB_BYTE[t.data_type]
        codes = np.asarray(nh.to_array(t)).astype(np.int64).reshape(-1) & ((1 << bits) - 1)
        per = 8 // bits
        padded = np.zeros(-(-codes.size // per) * per, np.uint8)
        padded[:codes.size] = codes
        packed = np.zeros(padded.size // per, np.uint8)
        for i in range(per):
            packed |= padded[i::per] << (i * bits)
        # onnxruntime reads ceil(n*bits/8) packed bytes from an n-element uint8 buffer.
        buf = np.zeros(max(codes.size, 1), np.uint8)
        buf[:packed.size] = packed
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(buf.reshape(tuple(t.dims)),
                                                               t.data_type)
    arr = nh.to_array(t)
    if t.data_type in EXOTIC:
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
            np.ascontiguousarray(arr).view(np.uint8), t.data_type)
    return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(arr))


def with_float_outputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """Append Cast(to=FLOAT) behind every output of a type numpy cannot hold."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    outs = []
    for o in m.graph.output:
        et = o.type.tensor_type.elem_type
        if et in EXOTIC:
            m.graph.node.append(H.make_node("Cast", [o.name], [o.name + "_f"], to=T.FLOAT))
            o2 = onnx.ValueInfoProto()
            o2.CopyFrom(o)
            o2.name = o.name + "_f"
            o2.type.tensor_type.elem_type = T.FLOAT
            outs.append(o2)
        else:
            outs.append(o)
    del m.graph.output[:]
    m.graph.output.extend(outs)
    return m


def run_ort(model: onnx.ModelProto, inputs: list[onnx.TensorProto]) -> list[np.ndarray]:
    import onnxruntime as ort

    m = with_float_outputs(model)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [i.name for i in m.graph.input if i.name not in {t.name for t in
                                                            m.graph.initializer}]
    feeds = {n: _ort_value(t) for n, t in zip(names, inputs)}
    return [np.asarray(v.numpy()).astype(np.float64)
            for v in sess.run_with_ort_values(None, feeds)]


def run_ref(model: onnx.ModelProto, inputs: list[onnx.TensorProto]) -> list[np.ndarray]:
    from onnx.reference import ReferenceEvaluator

    names = [i.name for i in model.graph.input
             if i.name not in {t.name for t in model.graph.initializer}]
    feeds = {n: nh.to_array(t) for n, t in zip(names, inputs)}
    return [np.asarray(v).astype(np.float64)
            for v in ReferenceEvaluator(model).run(None, feeds)]


def bake(model: onnx.ModelProto, inputs: list[onnx.TensorProto], keep: int = 1):
    """Turn every graph input after the first ``keep`` into an initializer (so scales and
    zero points are constants a form conversion can see)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    graph_inputs = list(m.graph.input)
    for vi, t in list(zip(graph_inputs, inputs))[keep:]:
        c = onnx.TensorProto()
        c.CopyFrom(t)
        c.name = vi.name
        m.graph.initializer.append(c)
    del m.graph.input[:]
    m.graph.input.extend(graph_inputs[:keep])
    return m, inputs[:keep]


def same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a, b, equal_nan=True)


# ----------------------------------------------------------------------------------------
# QDQ models from real images (onnxruntime quantize_static)


def _mobilenet_input(path: Path, size: int = 128) -> np.ndarray:
    from PIL import Image

    a = np.asarray(Image.open(path).convert("RGB").resize((size, size)), np.float32)
    return (a / 127.5 - 1.0).transpose(2, 0, 1)[None]


def _yolo_input(path: Path, size: int = 416) -> np.ndarray:
    from PIL import Image

    a = np.asarray(Image.open(path).convert("RGB").resize((size, size)), np.float32)
    return np.ascontiguousarray(a[..., ::-1].transpose(2, 0, 1)[None])


def make_qdq(src: Path, dst: Path, kind: str, activation: str = "uint8") -> Path:
    """quantize_static (QDQ, per-channel int8 weights) on ``len(IMAGES)`` real images."""
    from onnx import version_converter
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    name, fn = ("input_1:0", _mobilenet_input) if kind == "mobilenet" else ("images",
                                                                          _yolo_input)

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.items = iter([{name: fn(p)} for p in IMAGES])

        def get_next(self):
            return next(self.items, None)

    m = onnx.load(str(src))
    if m.opset_import[0].version < 13:  # per-channel DequantizeLinear needs opset 13
        m = version_converter.convert_version(m, 13)
    tmp = dst.with_suffix(".float.onnx")
    onnx.save(m, str(tmp))
    quantize_static(str(tmp), str(dst), Reader(), quant_format=QuantFormat.QDQ,
                    per_channel=True, weight_type=QuantType.QInt8,
                    activation_type=QuantType.QUInt8 if activation == "uint8"
                    else QuantType.QInt8)
    return dst
