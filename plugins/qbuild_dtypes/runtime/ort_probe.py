"""Facts about the installed onnxruntime, measured instead of frozen.

What onnxruntime loads (IR version, opset of each domain), which QDQ patterns it fuses and
which it rejects changes from release to release (1.32 loads IR 14 / opset 28 and runs
float8 weights in fused Conv groups; 1.31 refused both). :func:`probe` measures each fact
with a tiny model in a real session and keeps the answer:

* in the process (``functools.lru_cache``), and
* on disk, one JSON file per (onnxruntime, onnx, Python, platform) in
  ``~/.cache/qbuild-probes/`` (apart from qbuild's store), so each installed version is
  probed once. A damaged or foreign file is ignored and
  probed again; an unwritable folder only costs the re-probe.

Rules that depend on these facts already key onnxruntime's and onnx's versions, so the
facts are part of every key through them.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qbuild_onnx_common.models import load_model
from qbuild_onnx_common.ort import FATAL, session

if TYPE_CHECKING:
    import numpy.typing as npt
    import onnxruntime
    from onnx import ModelProto, NodeProto, TensorProto, ValueInfoProto

PROBE_VERSION = 1
# Domains whose highest loadable opset is measured (ai.onnx is "").
DOMAINS = ("", "ai.onnx.ml", "com.microsoft")


@dataclass(frozen=True)
class OrtFacts:
    """What the installed onnxruntime's CPU provider loads, fuses and rejects."""

    onnxruntime: str
    onnx: str
    max_ir: int
    max_opset: dict[str, int]
    # onnxruntime issue 25526: QuantizeLinear with output_dtype=INT8 and an int8 zero point.
    output_dtype_with_int8_zero_point: bool
    # DQ(float8 weight) -> Conv -> Q groups load (1.31 fused them and rejected its own node).
    float8_weights_in_qdq_groups: bool
    # 8-bit activation types that need an explicit zero point for QLinearConv fusion or for
    # the DQ -> Reshape -> Q pair removal.
    keep_activation_zero_point: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _cache_file(ort_version: str, onnx_version: str) -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    py = f"{sys.implementation.name}{sys.version_info[0]}{sys.version_info[1]}"
    name = (f"onnxruntime-{ort_version}-onnx-{onnx_version}-{py}-{platform.system()}-"
            f"{platform.machine()}-v{PROBE_VERSION}.json")
    return Path(base) / "qbuild-probes" / name.lower()


@functools.lru_cache(maxsize=1)
def probe() -> OrtFacts:
    """The installed onnxruntime's facts (measured once per installed version)."""
    import onnx
    import onnxruntime

    path = _cache_file(onnxruntime.__version__, onnx.__version__)
    try:
        data = json.loads(path.read_text())
        facts = OrtFacts(**data)
        if facts.onnxruntime == onnxruntime.__version__ and facts.onnx == onnx.__version__:
            return OrtFacts(**{**data, "max_opset": dict(data["max_opset"]),
                               "keep_activation_zero_point":
                                   tuple(data["keep_activation_zero_point"])})
    except (OSError, ValueError, TypeError, KeyError):
        pass
    facts = measure()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".probe-")
        with os.fdopen(fd, "w") as f:
            json.dump(facts.to_json(), f, sort_keys=True)
        os.replace(tmp, path)
    except OSError:
        pass
    return facts


def measure() -> OrtFacts:
    """Measure every fact now (about 50 ms)."""
    import onnx
    import onnxruntime

    return OrtFacts(
        onnxruntime=onnxruntime.__version__,
        onnx=onnx.__version__,
        max_ir=_highest(lambda v: _loads(_identity(ir=v)), 3, onnx.IR_VERSION),
        max_opset={d: _max_opset(d) for d in DOMAINS},
        output_dtype_with_int8_zero_point=_loads(_int8_zero_point_with_output_dtype()),
        float8_weights_in_qdq_groups=_loads(_float8_conv_group()),
        keep_activation_zero_point=tuple(
            t for t in ("int8", "uint8")
            if not (_fuses_without_zero_point(t) and _drops_reshape_pair_without_zero_point(t))),
    )


# --- tiny models ----------------------------------------------------------------------------

def _model(nodes: Sequence[NodeProto], inputs: Sequence[ValueInfoProto],
           outputs: Sequence[ValueInfoProto], inits: Sequence[TensorProto] = (),
           opsets: Sequence[tuple[str, int]] = (("", 21),), ir: int = 10) -> ModelProto:
    import onnx.helper as h

    g = h.make_graph(nodes, "probe", inputs, outputs, list(inits))
    m = h.make_model(g, opset_imports=[h.make_opsetid(d, v) for d, v in opsets])
    m.ir_version = ir
    return m


def _vi(name: str, elem: int, shape: Sequence[int]) -> ValueInfoProto:
    import onnx.helper as h

    return h.make_tensor_value_info(name, elem, shape)


def _identity(ir: int = 10, opsets: Sequence[tuple[str, int]] = (("", 21),)) -> ModelProto:
    import onnx.helper as h
    from onnx import TensorProto as T

    return _model([h.make_node("Identity", ["x"], ["y"])], [_vi("x", T.FLOAT, [1])],
                  [_vi("y", T.FLOAT, [1])], opsets=opsets, ir=ir)


def _session(model: ModelProto,
             optimized: str | None = None) -> onnxruntime.InferenceSession:
    return session(model, log_severity=FATAL, optimized_path=optimized)


def _loads(model: ModelProto) -> bool:
    try:
        _session(model)
        return True
    except Exception:
        return False


def _highest(ok: Callable[[int], bool], low: int, high: int) -> int:
    """The highest v in [low, high] with ok(v), scanning down (0 if none)."""
    for v in range(high, low - 1, -1):
        if ok(v):
            return v
    return 0


def _max_opset(domain: str) -> int:
    import onnx.defs

    if domain == "":
        return _highest(lambda v: _loads(_identity(opsets=(("", v),))), 7,
                        onnx.defs.onnx_opset_version())
    # Only the opset import is checked at load time; the node stays in ai.onnx.
    return _highest(lambda v: _loads(_identity(opsets=(("", 21), (domain, v)))), 1, 40)


def _consts(**arrays: npt.NDArray[Any]) -> list[TensorProto]:
    import onnx.numpy_helper as nh

    return [nh.from_array(a, name) for name, a in arrays.items()]


def _quantize_node(inputs: list[str], output: str, output_dtype: int | None) -> NodeProto:
    """A QuantizeLinear, stating ``output_dtype`` when one is given."""
    import onnx.helper as h

    if output_dtype is None:
        return h.make_node("QuantizeLinear", inputs, [output])
    return h.make_node("QuantizeLinear", inputs, [output], output_dtype=output_dtype)


def _int8_zero_point_with_output_dtype() -> ModelProto:
    import numpy as np
    import onnx.helper as h
    from onnx import TensorProto as T

    nodes = [h.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], output_dtype=T.INT8),
             h.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])]
    return _model(nodes, [_vi("x", T.FLOAT, [4])], [_vi("y", T.FLOAT, [4])],
                  _consts(s=np.array(0.1, np.float32), z=np.array(0, np.int8)))


def _conv_group(act: str, zero_point: bool, float8_weight: bool = False) -> ModelProto:
    import numpy as np
    import onnx.helper as h
    from onnx import TensorProto as T

    elem, dt, zero = (T.UINT8, np.uint8, 128) if act == "uint8" else (T.INT8, np.int8, 0)
    w = (np.arange(108, dtype=np.float32) % 7 - 3).reshape(4, 3, 3, 3)
    inits = _consts(sa=np.array(0.05, np.float32), sw=np.array(0.02, np.float32),
                    so=np.array(0.1, np.float32))
    if float8_weight:
        inits.append(h.make_tensor("w", T.FLOAT8E4M3FN, [4, 3, 3, 3], w.ravel().tolist()))
        wz: list[str] = []
    else:
        inits += _consts(w=w.astype(np.int8), zw=np.array(0, np.int8))
        wz = ["zw"]
    if zero_point:
        inits += _consts(za=np.array(zero, dt), zo=np.array(zero, dt))
    za, zo = (["za"], ["zo"]) if zero_point else ([], [])
    output_dtype = None if zero_point else elem
    nodes = [_quantize_node(["x", "sa", *za], "xq", output_dtype),
             h.make_node("DequantizeLinear", ["xq", "sa", *za], ["xd"]),
             h.make_node("DequantizeLinear", ["w", "sw", *wz], ["wd"]),
             h.make_node("Conv", ["xd", "wd"], ["c"]),
             _quantize_node(["c", "so", *zo], "cq", output_dtype),
             h.make_node("DequantizeLinear", ["cq", "so", *zo], ["y"])]
    return _model(nodes, [_vi("x", T.FLOAT, [1, 3, 8, 8])], [_vi("y", T.FLOAT, [1, 4, 6, 6])],
                  inits)


def _float8_conv_group() -> ModelProto:
    return _conv_group("uint8", True, float8_weight=True)


def _optimized_ops(model: ModelProto) -> list[str] | None:

    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "optimized.onnx")
        try:
            _session(model, out)
        except Exception:
            return None
        return [n.op_type for n in load_model(out).graph.node]


def _fuses_without_zero_point(act: str) -> bool:
    ops = _optimized_ops(_conv_group(act, zero_point=False))
    return ops is not None and "QLinearConv" in ops


def _drops_reshape_pair_without_zero_point(act: str) -> bool:
    import numpy as np
    import onnx.helper as h
    from onnx import TensorProto as T

    elem = T.UINT8 if act == "uint8" else T.INT8
    nodes = [h.make_node("QuantizeLinear", ["x", "s"], ["q1"], output_dtype=elem),
             h.make_node("DequantizeLinear", ["q1", "s"], ["d1"]),
             h.make_node("Reshape", ["d1", "shape"], ["r"]),
             h.make_node("QuantizeLinear", ["r", "s"], ["q2"], output_dtype=elem),
             h.make_node("DequantizeLinear", ["q2", "s"], ["y"])]
    m = _model(nodes, [_vi("x", T.FLOAT, [2, 4])], [_vi("y", T.FLOAT, [8])],
               _consts(s=np.array(0.1, np.float32), shape=np.array([8], np.int64)))
    ops = _optimized_ops(m)
    if ops is None:
        return False
    return ops.count("QuantizeLinear") + ops.count("DequantizeLinear") < 4
