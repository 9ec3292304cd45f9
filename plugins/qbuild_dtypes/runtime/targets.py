"""Dtype targets: what a runtime loads (IR version, opsets), which quantized types it runs,
and the QDQ policies it needs. Built-in: ``onnxruntime-cpu`` (the installed onnxruntime, its
limits and policies measured by :mod:`qbuild_dtypes.runtime.ort_probe`), ``onnx-reference`` and
``generic``; plugins add more through the ``qbuild_dtype_targets`` hook (see hookspecs).

Pure Python (no onnx import) so that rules can resolve target names cheaply; a measured
target is filled in from the probe only by :func:`get_target`, inside actions.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal, overload

from qbuild_onnx_common.errors import OnnxError

if TYPE_CHECKING:
    import pluggy

FORMS = ("output_dtype", "zero_point")
RUNTIMES = ("onnxruntime", "onnx-reference", None)


@dataclass(frozen=True)
class DtypeTarget:
    """A runtime (or a spec level) that QDQ models are written for.

    ``max_opset`` maps an opset domain ("" is ai.onnx) to the highest version the runtime
    loads; unlisted domains are not limited. ``None`` for ``max_opset[""]`` / ``max_ir`` means
    "whatever the installed onnx defines". ``qtypes`` / ``scale_types`` name the quantized and
    scale element types the runtime executes in Q/DQ (None: all the spec allows).
    """

    name: str
    description: str = ""
    runtime: str | None = None
    max_opset: dict[str, int] = field(default_factory=dict)
    max_ir: int | None = None
    qtypes: frozenset[str] | None = None
    scale_types: frozenset[str] | None = None
    # Quantized types whose activation Q/DQ keep an explicit zero point even in the
    # output_dtype form. onnxruntime 1.31 fuses DQ->Conv/MatMul->Q into QLinearConv only when
    # int8 activations carry one, and drops DQ->Reshape->Q pairs only when both state theirs
    # (measured with uint8 too).
    keep_activation_zero_point: frozenset[str] = frozenset()
    # onnxruntime issue 25526: output_dtype=INT8 plus an int8 zero point fails session creation.
    output_dtype_with_int8_zero_point: bool = True
    # onnxruntime 1.31 fuses DQ(float8 weight) -> Conv -> Q into QLinearConv and then
    # rejects its own fused node at session creation (measured on MobileNetV2).
    float8_weights_in_qdq_groups: bool = True
    preferred_form: str = "output_dtype"
    notes: str = ""
    # True: max_opset, max_ir and the three policies above are measured on the installed
    # runtime by get_target (the values written here are placeholders).
    measured: bool = False

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise OnnxError("dtype target: name must be a non-empty string")
        if self.runtime not in RUNTIMES:
            raise OnnxError(f"dtype target {self.name!r}: runtime must be one of "
                             f"{RUNTIMES}, got {self.runtime!r}")
        if self.preferred_form not in FORMS:
            raise OnnxError(f"dtype target {self.name!r}: preferred_form must be one of "
                             f"{FORMS}")

    @overload
    def opset_limit(self, domain: Literal["", "ai.onnx"] = "") -> int: ...

    @overload
    def opset_limit(self, domain: str) -> int | None: ...

    def opset_limit(self, domain: str = "") -> int | None:
        """Highest loadable opset of ``domain``; for ai.onnx, defaults to onnx's latest."""
        if domain in ("", "ai.onnx"):
            v = self.max_opset.get("", self.max_opset.get("ai.onnx"))
            if v is None:
                import onnx.defs

                latest: int = onnx.defs.onnx_opset_version()
                return latest
            return v
        return self.max_opset.get(domain)

    def ir_limit(self) -> int:
        if self.max_ir is None:
            import onnx

            return onnx.IR_VERSION
        return self.max_ir

    def allows_qtype(self, name: str) -> bool:
        return self.qtypes is None or name in self.qtypes

    def allows_scale_type(self, name: str) -> bool:
        return self.scale_types is None or name in self.scale_types

    def to_info(self) -> dict[str, object]:
        """JSON-friendly description, for reports."""
        out: dict[str, object] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, frozenset):
                v = sorted(v)
            elif isinstance(v, dict):
                v = dict(sorted(v.items()))
            out[f.name] = v
        return out


_ORT_QTYPES = frozenset({"uint8", "int8", "uint16", "int16", "uint4", "int4", "uint2", "int2",
                         "float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz"})

ONNXRUNTIME_CPU = DtypeTarget(
    name="onnxruntime-cpu",
    description="the installed onnxruntime's CPU execution provider",
    runtime="onnxruntime",
    measured=True,
    qtypes=_ORT_QTYPES,  # no float4e2m1 QuantizeLinear kernel
    scale_types=frozenset({"float", "float16"}),  # bfloat16 Q/DQ: NOT_IMPLEMENTED
    keep_activation_zero_point=frozenset({"int8", "uint8"}),
    output_dtype_with_int8_zero_point=False,
    float8_weights_in_qdq_groups=False,
    preferred_form="output_dtype",
    notes="limits and policies measured on the installed onnxruntime: 8-bit activations "
          "keep an explicit zero point where fusion needs one (QLinearConv, QDQ pair removal "
          "around Reshape); output_dtype with an int8 zero point only where it loads "
          "(onnxruntime issue 25526)",
)


def resolve_measured(target: DtypeTarget) -> DtypeTarget:
    """``target`` with its measured limits and policies filled in from the probe."""
    if not target.measured:
        return target
    from dataclasses import replace

    from .ort_probe import probe

    facts = probe()
    return replace(
        target, measured=False, max_opset=dict(facts.max_opset), max_ir=facts.max_ir,
        keep_activation_zero_point=frozenset(facts.keep_activation_zero_point),
        output_dtype_with_int8_zero_point=facts.output_dtype_with_int8_zero_point,
        float8_weights_in_qdq_groups=facts.float8_weights_in_qdq_groups,
        description=f"onnxruntime {facts.onnxruntime} CPU execution provider (measured)")

ONNX_REFERENCE = DtypeTarget(
    name="onnx-reference",
    description="onnx.reference.ReferenceEvaluator of the installed onnx",
    runtime="onnx-reference",
    preferred_form="output_dtype",
)

GENERIC = DtypeTarget(
    name="generic",
    description="any runtime conforming to the ONNX spec of the installed onnx; "
                "no runtime check",
    runtime=None,
    preferred_form="output_dtype",
)

BUILTIN_TARGETS: tuple[DtypeTarget, ...] = (ONNXRUNTIME_CPU, ONNX_REFERENCE, GENERIC)


# What a qbuild_dtype_targets implementation returns: targets, or dicts of their fields.
TargetDefinition = DtypeTarget | dict[str, Any]


def _coerce(obj: object, source: str) -> DtypeTarget:
    if isinstance(obj, DtypeTarget):
        return obj
    if isinstance(obj, dict):
        d = dict(obj)
        for key in ("qtypes", "scale_types", "keep_activation_zero_point"):
            if d.get(key) is not None:
                d[key] = frozenset(d[key])
        try:
            return DtypeTarget(**d)
        except TypeError as e:
            raise OnnxError(f"dtype target from {source}: {e}") from None
    raise OnnxError(f"dtype target from {source}: expected a DtypeTarget or a dict, "
                     f"got {type(obj).__name__}")


def collect_targets(pluginmanager: pluggy.PluginManager | None = None,
                    extra: Iterable[TargetDefinition] = ()) -> dict[str, DtypeTarget]:
    """All known targets by name: built-ins, then hook results, then ``extra``."""
    found: dict[str, DtypeTarget] = {t.name: t for t in BUILTIN_TARGETS}
    contributed: list[TargetDefinition] = []
    hook = getattr(getattr(pluginmanager, "hook", None), "qbuild_dtype_targets", None)
    if hook is not None:
        for result in hook():
            contributed.extend(result or [])
    contributed.extend(extra)
    for obj in contributed:
        t = _coerce(obj, "qbuild_dtype_targets")
        if t.name in found and found[t.name] != t:
            raise OnnxError(f"dtype target {t.name!r} is defined twice")
        found[t.name] = t
    return dict(sorted(found.items()))


def get_target(name: str | DtypeTarget, pluginmanager: pluggy.PluginManager | None = None,
               extra: Iterable[TargetDefinition] = ()) -> DtypeTarget:
    """Resolve a target by name (a DtypeTarget passes through), measuring it if needed."""
    if isinstance(name, DtypeTarget):
        return resolve_measured(name)
    known = collect_targets(pluginmanager, extra)
    if name not in known:
        raise OnnxError(f"unknown dtype target {name!r}; known: {', '.join(known)}")
    return resolve_measured(known[name])
