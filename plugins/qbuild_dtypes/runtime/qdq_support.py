"""Which Q/DQ nodes a target runs: their quantized and scale element types, and the
float8 weight groups onnxruntime fuses and then rejects.
"""

from __future__ import annotations

from onnx import ModelProto, TensorProto
from qbuild_onnx_common.errors import OnnxError
from qbuild_onnx_common.graph import GraphIndex
from qbuild_onnx_common.summary import onnx_type_name

from ..graph.qdq import QdqNode
from ..numerics.qtypes import is_qtype, qtype
from .targets import DtypeTarget

_FLOAT8 = {TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E4M3FNUZ, TensorProto.FLOAT8E5M2,
           TensorProto.FLOAT8E5M2FNUZ}
_GROUP_OPS = {"Conv", "ConvTranspose", "MatMul", "Gemm"}
# Scale types as DtypeTarget.scale_types names them.
_SCALE_TYPE_NAMES: dict[int, str] = {TensorProto.FLOAT: "float", TensorProto.FLOAT16: "float16",
                                     TensorProto.BFLOAT16: "bfloat16"}


def check_target_types(nodes: list[QdqNode], target: DtypeTarget,
                       model: ModelProto | None = None) -> None:
    """Raise if a Q/DQ uses a quantized or scale type the target cannot run (or, given the
    model, a combination the target's runtime is known to reject)."""
    if model is not None and not target.float8_weights_in_qdq_groups:
        _check_float8_groups(nodes, target, model)
    for qn in nodes:
        if qn.qelem is not None and is_qtype(qn.qelem):
            q = qtype(qn.qelem)
            if not target.allows_qtype(q.name):
                raise OnnxError(f"target {target.name!r} cannot run {qn.label} with "
                                 f"{onnx_type_name(qn.qelem)} (supported: "
                                 f"{', '.join(sorted(target.qtypes or []))})")
        if qn.scale_elem is not None:
            sname = _SCALE_TYPE_NAMES.get(qn.scale_elem, onnx_type_name(qn.scale_elem).lower())
            if not target.allows_scale_type(sname):
                raise OnnxError(f"target {target.name!r} cannot run {qn.label} with a "
                                 f"{onnx_type_name(qn.scale_elem)} scale")


def _check_float8_groups(nodes: list[QdqNode], target: DtypeTarget, model: ModelProto) -> None:
    readers = GraphIndex(model.graph).consumers
    for qn in nodes:
        if qn.is_q or not qn.x_const or qn.qelem not in _FLOAT8:
            continue
        for op in readers.get(qn.node.output[0], []):
            if op.op_type not in _GROUP_OPS:
                continue
            if any(c.op_type == "QuantizeLinear" for o in op.output
                   for c in readers.get(o, [])):
                raise OnnxError(
                    f"target {target.name!r} cannot run {qn.label}: a {onnx_type_name(qn.qelem)} "
                    f"weight inside a quantized {op.op_type} group ({op.name or op.output[0]!r}"
                    f" -> QuantizeLinear) makes onnxruntime fuse it into an 8-bit QLinear "
                    f"kernel and reject the session; use an integer dtype for this weight or "
                    f"leave the {op.op_type} output in float")
