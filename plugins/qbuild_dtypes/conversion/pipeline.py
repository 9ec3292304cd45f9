"""The two end-to-end transformations behind the rules, as plain functions:

* :func:`retarget`: opset handling + form conversion + target policies + equivalence check;
* :func:`requantize_weights`: weight (re-)quantization, then :func:`retarget`;
* :func:`write_checked`: save, then validate (full checker, load-and-run in the target's
  runtime, onnxruntime fusion counts, output drift against the source model);
* :func:`retarget_file` / :func:`requantize_file`: the same from file to file with a report.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TypedDict

import onnx
from onnx import ModelProto
from qbuild_onnx_common.errors import OnnxError
from qbuild_onnx_common.graph import opset
from qbuild_onnx_common.models import load_model

from ..graph import qdq
from ..graph.qdq import EquivalenceProof
from ..runtime import compat
from ..runtime.compat import LoadCheck
from ..runtime.targets import FORMS, DtypeTarget, get_target
from ..validation import checks
from ..validation.report import ModelSummary, model_summary
from . import forms, requantize
from .requantize import Policy, RequantizationRecord


class RetargetInfo(TypedDict):
    """What :func:`retarget` did: form, target, opsets and IR versions before and after,
    the conversion counters and the equivalence proof."""

    form: str
    target: str
    opset_before: int | None
    opset_after: int | None
    ir_before: int
    ir_after: int
    conversion: dict[str, int]
    equivalence: EquivalenceProof


class RequantizeInfo(RetargetInfo):
    """What :func:`requantize_weights` did: the retargeting, and every weight."""

    requantization: RequantizationRecord


class LoadValidation(TypedDict):
    """What :func:`write_checked` checks on every written model."""

    full_check: bool
    loadable: LoadCheck


class ValidationRecord(LoadValidation, total=False):
    """What :func:`write_checked` checked; an onnxruntime target adds the fused ops (and
    the drift, given the source)."""

    onnxruntime_fused_ops: dict[str, int]
    max_abs_diff_vs_source: float | None


class FileReport(TypedDict):
    """The report.json fields around a rule's info: the rule, the model before and after,
    and the validation."""

    rule: str
    before: ModelSummary
    validation: ValidationRecord
    after: ModelSummary


class RetargetReport(RetargetInfo, FileReport):
    """report.json of ``qdq_retarget``."""


class RequantizeReport(RequantizeInfo, FileReport):
    """report.json of ``requantize_weights``."""


def _resolve_form(form: str, target: DtypeTarget) -> str:
    if form == "auto":
        return target.preferred_form
    if form not in FORMS:
        raise OnnxError(f"form must be auto, {' or '.join(FORMS)}; got {form!r}")
    return form


def _fit_opset(model: ModelProto, target: DtypeTarget) -> ModelProto:
    limit = target.opset_limit("")
    cur = opset(model)
    if cur is not None and cur > limit:
        try:
            return compat.set_opset(model, limit)
        except OnnxError as e:
            raise OnnxError(f"target {target.name!r} loads ai.onnx opset <= {limit}: "
                             f"{e.message}") from None
    return model


def _raise_opset(model: ModelProto, need: int, why: str, target: DtypeTarget) -> ModelProto:
    limit = target.opset_limit("")
    if need > limit:
        raise OnnxError(f"target {target.name!r} cannot express this: {why} needs ai.onnx "
                         f"opset {need}, but it loads opset <= {limit}")
    cur = opset(model) or 1
    return compat.set_opset(model, need) if need > cur else model


def retarget(model: ModelProto, target: DtypeTarget | str,
             form: str = "auto") -> tuple[ModelProto, RetargetInfo]:
    """Convert ``model`` to ``form`` for ``target``. Returns (model, info) where info holds
    the form, opsets before/after, the conversion counters and the equivalence proof."""
    target = get_target(target)
    form = _resolve_form(form, target)
    source = model
    m = _fit_opset(model, target)
    limit = target.opset_limit("")
    converted, stats = forms.convert_form(m, target, form, max_opset=limit)
    if stats.get("output_dtype_unavailable"):
        raise OnnxError(f"target {target.name!r} cannot express the output_dtype form: it "
                         f"loads ai.onnx opset <= {limit} and output_dtype needs 21 "
                         f"({stats['output_dtype_unavailable']} QuantizeLinear nodes)")
    need, why = compat.required_opset(converted)
    if need > (opset(m) or 1):
        m = _raise_opset(m, need, why, target)
        converted, stats = forms.convert_form(m, target, form, max_opset=limit)
    converted = compat.make_loadable(converted, target)
    proof = qdq.check_equivalent(source, converted)
    return converted, {
        "form": form,
        "target": target.name,
        "opset_before": opset(source),
        "opset_after": opset(converted),
        "ir_before": source.ir_version,
        "ir_after": converted.ir_version,
        "conversion": stats,
        "equivalence": proof,
    }


def requantize_weights(model: ModelProto, target: DtypeTarget | str, form: str = "auto",
                       policy: Policy | None = None, tensors: Policy | None = None,
                       min_elements: int = requantize.DEFAULT_MIN_ELEMENTS
                       ) -> tuple[ModelProto, RequantizeInfo]:
    """(Re-)quantize weights per ``policy`` / ``tensors``, then :func:`retarget`."""
    target = get_target(target)
    m = _fit_opset(model, target)
    plans, _ = requantize.plan(m, policy, tensors, min_elements)
    for w in plans:
        if not target.allows_qtype(w.spec.q.name):
            raise OnnxError(f"target {target.name!r} cannot run {w.spec.q.name} "
                             f"(tensor {w.key!r})")
    need = requantize.needed_opset(plans)
    if need > (opset(m) or 1):
        worst = max(plans, key=lambda w: w.spec.min_opset())
        m = _raise_opset(m, need, f"tensor {worst.key!r} as {worst.spec.q.name} "
                                  f"{worst.spec.granularity}", target)
    quantized, rinfo = requantize.requantize(m, policy, tensors, min_elements)
    out, info = retarget(quantized, target, form)
    return out, {**info, "opset_before": opset(model), "ir_before": model.ir_version,
                 "requantization": rinfo}


def write_checked(model: ModelProto, out_path: str | Path, target: DtypeTarget | str, *,
                  source_path: str | Path | None = None,
                  input_dims: Mapping[str, int] | None = None, run: bool = True,
                  scratch: str | Path | None = None) -> ValidationRecord:
    """Save ``model`` and validate the file; returns the validation record (deterministic)."""
    target = get_target(target)
    out_path = Path(out_path)
    checks.full_check(model, out_path.name)
    onnx.save(model, str(out_path))
    loaded = compat.check_loadable(out_path, target, input_dims, run=run)
    record: ValidationRecord = {"full_check": True, "loadable": loaded}
    if run and target.runtime == "onnxruntime":
        with tempfile.TemporaryDirectory(dir=scratch) as tmp:
            record["onnxruntime_fused_ops"] = {
                k: v for k, v in checks.fused_op_counts(out_path, tmp).items()
                if k.startswith(("QLinear", "MatMulNBits", "MatMulInteger", "QGemm",
                                 "DequantizeLinear", "QuantizeLinear", "Conv", "MatMul"))}
        if source_path is not None:
            record["max_abs_diff_vs_source"] = _drift(source_path, out_path, input_dims)
    return record


def _drift(source_path: str | Path, out_path: Path,
           input_dims: Mapping[str, int] | None) -> float | None:
    """Largest output difference against the source model on the same synthetic inputs
    (None if the source does not load in onnxruntime)."""
    m = load_model(out_path, external_data=False)
    feeds = checks.synthetic_feeds(m, input_dims)
    try:
        ref = checks.run_onnxruntime(source_path, feeds)
    except OnnxError:
        return None
    got = checks.run_onnxruntime(out_path, feeds)
    return float(f"{checks.max_abs_diff(ref, got):.6g}")


def _write_report(report: RetargetReport | RequantizeReport, path: str | Path | None) -> None:
    if path is not None:
        Path(path).write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")


def retarget_file(src: str | Path, dst: str | Path, target: DtypeTarget | str,
                  form: str = "auto", report_path: str | Path | None = None,
                  input_dims: Mapping[str, int] | None = None,
                  run: bool = True) -> RetargetReport:
    """File-to-file :func:`retarget` with validation; returns (and writes) the report."""
    target = get_target(target)
    model = load_model(src)
    out, info = retarget(model, target, form)
    before = model_summary(model, src)
    validation = write_checked(out, dst, target, source_path=src, input_dims=input_dims,
                               run=run)
    report: RetargetReport = {"rule": "qdq_retarget", "before": before, **info,
                              "validation": validation, "after": model_summary(out, dst)}
    _write_report(report, report_path)
    return report


def requantize_file(src: str | Path, dst: str | Path, target: DtypeTarget | str,
                    form: str = "auto", policy: Policy | None = None,
                    tensors: Policy | None = None,
                    min_elements: int = requantize.DEFAULT_MIN_ELEMENTS,
                    report_path: str | Path | None = None,
                    input_dims: Mapping[str, int] | None = None,
                    run: bool = True) -> RequantizeReport:
    """File-to-file :func:`requantize_weights` with validation; returns the report."""
    target = get_target(target)
    model = load_model(src)
    out, info = requantize_weights(model, target, form, policy, tensors, min_elements)
    before = model_summary(model, src)
    validation = write_checked(out, dst, target, source_path=src, input_dims=input_dims,
                               run=run)
    report: RequantizeReport = {"rule": "requantize_weights", "before": before, **info,
                                "validation": validation, "after": model_summary(out, dst)}
    _write_report(report, report_path)
    return report
