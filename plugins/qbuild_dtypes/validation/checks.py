"""Checks run on every model this plugin writes: onnx's checker with full checking (the plain
checker misses output_dtype / zero point mismatches), and load-and-run checks in onnxruntime
or onnx's reference evaluator on deterministic synthetic inputs (never an input, nor a
model tensor, over the allocation bound: ``qbuild_onnx_common.allocation``).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import onnx
from onnx import ModelProto
from qbuild_onnx_common.allocation import check_arrays, check_model
from qbuild_onnx_common.errors import OnnxError
from qbuild_onnx_common.models import load_model
from qbuild_onnx_common.ort import session, short_message

# One synthetic value per graph input, by input name.
Feeds = dict[str, npt.NDArray[Any]]

_NP_OF: dict[int, type[np.generic]] = {
    onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.FLOAT16: np.float16,
    onnx.TensorProto.DOUBLE: np.float64, onnx.TensorProto.INT64: np.int64,
    onnx.TensorProto.INT32: np.int32, onnx.TensorProto.INT8: np.int8,
    onnx.TensorProto.UINT8: np.uint8, onnx.TensorProto.BOOL: np.bool_}


def full_check(model: ModelProto, where: str = "model") -> None:
    """onnx.checker with full_check=True (strict shape and type inference)."""
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as e:  # checker / inference errors have several types
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise OnnxError(f"{where}: onnx checker (full_check) failed: {first}") from None


def synthetic_feeds(model: ModelProto, dims: Mapping[str, int] | None = None,
                    seed: int = 0) -> Feeds:
    """One deterministic input per graph input: N(0, 1) floats, zeros for integers.

    Symbolic or unknown dimensions take their value from ``dims`` (by name), else 1.
    """
    dims = dims or {}
    init = {t.name for t in model.graph.initializer}
    rng = np.random.default_rng(seed)
    specs: dict[str, tuple[type[np.generic], list[int]]] = {}
    for vi in model.graph.input:
        if vi.name in init:
            continue
        tt = vi.type.tensor_type
        if tt.elem_type not in _NP_OF:
            raise OnnxError(f"input {vi.name!r}: cannot synthesize values of type "
                             f"{onnx.TensorProto.DataType.Name(tt.elem_type)}")
        shape = []
        for d in tt.shape.dim:
            if d.HasField("dim_value") and d.dim_value > 0:
                shape.append(d.dim_value)
            else:
                shape.append(int(dims.get(d.dim_param, dims.get(vi.name, 1))))
        specs[vi.name] = (_NP_OF[tt.elem_type], shape)
    check_arrays("input", specs)  # declared shapes: bounded before anything is made
    feeds: Feeds = {}
    for name, (np_type, shape) in specs.items():
        if np.issubdtype(np_type, np.floating):
            feeds[name] = rng.standard_normal(shape).astype(np_type)
        else:
            feeds[name] = np.zeros(shape, np_type)
    return feeds


def run_onnxruntime(model_path: str | Path, feeds: Mapping[str, npt.NDArray[Any]],
                    optimized_path: str | Path | None = None) -> list[npt.NDArray[Any]]:
    sess = session(model_path, optimized_path=optimized_path)
    try:
        outputs: list[npt.NDArray[Any]] = sess.run(None, feeds)
        return outputs
    except Exception as e:
        raise OnnxError(f"{Path(model_path).name}: onnxruntime failed to run the model: "
                         f"{short_message(e)}") from None


def run_reference(model: ModelProto, feeds: Feeds,
                  where: str = "model") -> list[npt.NDArray[Any]]:
    from onnx.reference import ReferenceEvaluator

    # the evaluator makes every tensor with numpy: none may be over the allocation bound
    check_model(model, what=where, inputs={k: np.shape(v) for k, v in feeds.items()})
    try:
        # run() gives a dict only when asked for intermediate results.
        return cast("list[npt.NDArray[Any]]", ReferenceEvaluator(model).run(None, feeds))
    except Exception as e:
        raise OnnxError(f"{where}: onnx reference evaluator failed: {short_message(e)}") from None


def fused_op_counts(model_path: str | Path, scratch: str | Path) -> dict[str, int]:
    """Op types of the graph onnxruntime actually runs after its optimizations (counted)."""
    opt = Path(scratch) / (Path(model_path).stem + ".ort_optimized.onnx")
    session(model_path, optimized_path=opt)
    m = load_model(opt, external_data=False)
    counts = Counter(n.op_type for n in m.graph.node)
    try:
        os.remove(opt)
    except OSError:
        pass
    return dict(sorted(counts.items()))


def max_abs_diff(a: Sequence[npt.ArrayLike], b: Sequence[npt.ArrayLike]) -> float:
    worst = 0.0
    for x, y in zip(a, b):
        xd = np.asarray(x, np.float64)
        yd = np.asarray(y, np.float64)
        if xd.shape != yd.shape:
            return float("inf")
        if xd.size:
            worst = max(worst, float(np.max(np.abs(xd - yd))))
    return worst
