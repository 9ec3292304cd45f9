"""Static quantization from saved ranges, and dynamic quantization, with onnxruntime.

Owns the two steps end to end, as plain functions over paths: read and check inputs
(calibration made on this exact model file), bring the model to an opset the result is
valid at, run onnxruntime's QDQ / QOperator / dynamic quantizer (static: with the saved
ranges in place of a calibrator, never recalibrating), validate, write the model and
``report.json``, and return the info dependents read. The rules in ``rules.quantize`` are
thin wrappers over ``quantize_static_model`` and ``quantize_dynamic_model``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import onnx
from qbuild_onnx_common.errors import OnnxError, exception_reason
from qbuild_onnx_common.files import sha256_bytes
from qbuild_onnx_common.graph import bump_ir_version, real_inputs
from qbuild_onnx_common.models import lean_load, weightless
from qbuild_onnx_common.summary import describe_values

from ..algorithms.markers import keep_float_nodes
from ..ort_logs import ort_output_to_log
from ..source.model_checks import (
    control_flow_compute,
    describe_quantized,
    flatten_gemm_biases,
    grouped_conv_transposes_with_bias,
    top_level_compute,
)
from .joins import DEFAULT_RATIO, find_mixed_joins, name_nodes
from .opset import ai_onnx_opset, required_opset, upgrade
from .options import (
    CONV_INPUT_OPS,
    DYNAMIC_OP_TYPES,
    DynamicOptions,
    StaticOptions,
    check_dynamic_options,
    check_static_options,
)
from .overrides import build_tensor_overrides, quant_type
from .placement import keep_float_readers
from .ranges import check_calibration_matches, load_calibration, tensors_data
from .report import build_report
from .selectors import resolve_node_table, resolve_nodes, resolve_tensors
from .validate import (
    check_clamped_outputs,
    check_interface,
    check_onnx,
    check_onnxruntime,
)

Log = Callable[[str], None]
OptionsT = TypeVar("OptionsT", StaticOptions, DynamicOptions)

if TYPE_CHECKING:
    from onnxruntime.quantization.base_quantizer import BaseQuantizer

_INFER_KEY = "onnx.infer"  # metadata onnxruntime's quantizer adds; not part of our output
_MAX_PROTO = 2**31 - 1


def _load(path: Path) -> tuple[bytes, onnx.ModelProto]:
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise OnnxError(f"model file {path} does not exist", attr="model") from None
    try:
        # External weights stay on disk: shapes are inferred on the graph alone (a model
        # over 2 GB cannot be serialized) and the quantizer reads them one at a time.
        model = lean_load(path)
    except Exception as exc:  # protobuf's DecodeError and onnx's own errors
        raise OnnxError(f"model file {path} is not an ONNX model: {exc}",
                            attr="model") from None
    return data, model


def _float_bytes(onnx_bytes: int, path: Path, model: onnx.ModelProto) -> int:
    """Size of the float model: the .onnx file and its external data files."""
    from qbuild_onnx_common.models import locations

    return onnx_bytes + sum((Path(path).parent / loc).stat().st_size
                            for loc in locations(model))


def _drop_initializer_inputs(model: onnx.ModelProto, log: Log) -> None:
    # IR < 4 models list weights as graph inputs; once a weight is quantized its float
    # initializer is gone and the input would become a required one.
    inits = {i.name for i in model.graph.initializer}
    dropped = [i.name for i in model.graph.input if i.name in inits]
    if dropped:
        kept = [i for i in model.graph.input if i.name not in inits]
        del model.graph.input[:]
        model.graph.input.extend(kept)
        log(f"initializers listed as graph inputs are treated as constants: {len(dropped)}")


def _check_quantizable(model: onnx.ModelProto, action: str, warn: Log) -> None:
    """Refuse already-quantized models and models whose compute sits only in If/Loop/Scan
    subgraphs (onnxruntime quantizes the main graph only: nothing would change)."""
    refusal = describe_quantized(model, action)
    if refusal:
        raise OnnxError(refusal, attr="model")
    hidden = control_flow_compute(model)
    if not hidden:
        return
    where = ", ".join(f"{op} '{name}' ({k} compute nodes)" for name, op, k in hidden)
    if top_level_compute(model) == 0:
        raise OnnxError(f"the model's compute is inside control-flow subgraphs ({where}); "
                            "onnxruntime's quantizer only quantizes the main graph, so the "
                            "result would be the float model: export the model without If/"
                            "Loop branches or quantize the branch as its own model",
                            attr="model")
    warn(f"compute inside control-flow subgraphs stays float: {where}")


def _prepare(model: onnx.ModelProto, target_opset: int, log: Log) -> onnx.ModelProto:
    from onnxruntime.quantization.quant_utils import add_infer_metadata

    current = ai_onnx_opset(model)
    if target_opset > current:
        log(f"upgrading the model from opset {current} to {target_opset}")
    model = upgrade(model, target_opset)
    bump_ir_version(model)
    _drop_initializer_inputs(model, log)
    model = onnx.shape_inference.infer_shapes(model)
    add_infer_metadata(model)  # tells the quantizer shapes are inferred: no temp-file reload
    return model


def _run_quantizer(build: Callable[[], Any], log: Log, warn: Log, model: onnx.ModelProto,
                   model_path: Path) -> onnx.ModelProto:
    """Run onnxruntime's quantizer; external weights are read from ``model_path``'s folder
    one at a time, and those left float are loaded into the result."""
    from qbuild_onnx_common.models import fill, uses_external_data, weights_readable_from

    base = os.path.abspath(Path(model_path).parent) if uses_external_data(model) else None
    with weights_readable_from(base):
        quantized = _run_ort_quantizer(build, log, warn)
    return quantized if base is None else fill(quantized, base)


def _run_ort_quantizer(build: Callable[[], Any], log: Log, warn: Log) -> onnx.ModelProto:
    with ort_output_to_log(log, warn):
        try:
            quantizer = build()
            quantizer.quantize_model()
        except (ValueError, TypeError, KeyError, AssertionError, NotImplementedError) as exc:
            raise OnnxError(f"onnxruntime's quantizer rejected the model or options: "
                                f"{exception_reason(exc)}") from None
        quantizer.model.topological_sort()
    quantized: onnx.ModelProto = quantizer.model.model
    return quantized


def _finish(original: onnx.ModelProto, box: list[onnx.ModelProto], output_path: Path,
            report_path: Path | None, float_bytes: int, settings: dict[str, Any],
            had_infer_key: bool) -> tuple[dict[str, Any], dict[str, Any], onnx.ModelProto]:
    """Write the quantized model (the only reference to it is ``box``, emptied here), then
    validate and describe the written file: (info, report, the model without its weights).

    Once written, the model is freed before the checker and the onnxruntime session read
    the file, so a large model is held at most once more than its result (issue 14's
    memory goal); reports and interface checks read a weightless copy."""
    quantized = box.pop()
    bump_ir_version(quantized)
    if not had_infer_key:
        props = [p for p in quantized.metadata_props if p.key != _INFER_KEY]
        del quantized.metadata_props[:]
        quantized.metadata_props.extend(props)
    if quantized.ByteSize() > _MAX_PROTO:
        raise OnnxError("the quantized model is over 2 GiB, which needs external data; "
                            "not supported yet")
    output_path = Path(output_path)
    data = quantized.SerializeToString()
    model_bytes, model_sha256 = len(data), sha256_bytes(data)
    output_path.write_bytes(data)
    skeleton = weightless(quantized)
    del data, quantized
    try:
        check_onnx(output_path)
        check_onnxruntime(output_path)
        check_interface(original, skeleton)
        check_clamped_outputs(original, skeleton)
    except OnnxError:
        output_path.unlink(missing_ok=True)
        raise
    report = build_report(skeleton, model_bytes=model_bytes, float_model_bytes=float_bytes,
                          settings=settings)
    if report_path is not None:
        Path(report_path).write_text(json.dumps(report, indent=2, sort_keys=True) + "\n",
                                     encoding="utf-8")
    info = {
        **settings,
        "opset": ai_onnx_opset(skeleton),
        "ir_version": skeleton.ir_version,
        "inputs": describe_values(real_inputs(skeleton)),
        "outputs": describe_values(skeleton.graph.output),
        "quantized_nodes": report["quantized_nodes"],
        "model_sha256": model_sha256,
    }
    return info, report, skeleton


def _warn_lost_per_channel(report: dict[str, Any], overridden: set[str], warn: Log) -> None:
    nodes = [n for n in report["weights"]["per_tensor_nodes"] if n not in overridden]
    if nodes:
        warn(f"per_channel is on but these nodes got per-tensor weights: {', '.join(nodes)}")


def quantize_static_model(
    model_path: Path,
    calibration_path: Path,
    output_path: Path,
    options: StaticOptions,
    *,
    report_path: Path | None = None,
    log: Log | None = None,
    warn: Log | None = None,
    rewrites: Mapping[str, Any] | None = None,
    float_joins_ratio: float = DEFAULT_RATIO,
) -> dict[str, Any]:
    """Quantize ``model_path`` statically with the ranges saved in ``calibration_path``.

    Writes the quantized model to ``output_path`` (and the report to ``report_path``) and
    returns the info for dependents. Node and tensor names in ``options`` may be selectors
    (see :mod:`.selectors`); ``rewrites`` (from ``quant_preprocess``) explains names that
    pre-processing removed. Raises ``OnnxError`` for bad input. Concats whose
    inputs' calibrated ranges differ by ``float_joins_ratio`` or more (boxes in pixels
    beside probabilities) are kept float with the data movement after them (0: never).
    """
    log = log or (lambda _msg: None)
    warn = warn or log
    check_static_options(options)
    model: onnx.ModelProto | None  # dropped before _finish (see there)
    data, model = _load(model_path)
    _check_quantizable(model, "static quantization", warn)
    calibration = load_calibration(calibration_path)
    check_calibration_matches(calibration, Path(model_path), sha256_bytes(data))
    options = _resolve_selectors(options, model, rewrites, log)

    # Overrides are checked on the model as given, before any opset conversion renames.
    overrides = build_tensor_overrides(options.tensor_overrides, options.node_overrides, model,
                                       options.weight_type, options.activation_type)
    types = {options.weight_type, options.activation_type}
    types |= _override_type_names(options)
    per_axis = options.per_channel or any(len(v) > 1 or "axis" in v[0]
                                          for v in overrides.values())
    target = required_opset(
        ai_onnx_opset(model), per_axis=per_axis, types=types,
        block_size=int(options.extra_options.get("BlockSize", 0) or 0),
        contrib_qdq=bool(options.extra_options.get("UseQDQContribOps", False)))
    had_infer_key = any(p.key == _INFER_KEY for p in model.metadata_props)
    original = model
    model = _prepare(model, target, log)

    names = {i.name for i in model.graph.input} | {o for n in model.graph.node for o in n.output}
    ranges = tensors_data(calibration, names)
    op_types = options.quantized_op_types()
    # a join matters only where Concat is quantized (never with placement conv_inputs)
    joins = find_mixed_joins(model, calibration.ranges,
                             float_joins_ratio if "Concat" in op_types else 0.0)
    if any(not name for j in joins for name in j.float_nodes):
        name_nodes(model)
        joins = find_mixed_joins(model, calibration.ranges, float_joins_ratio)
    excluded = list(options.nodes_to_exclude)
    marked = [n for n in keep_float_nodes(model) if n not in excluded]
    if marked:  # e.g. SmoothQuant's Mul: its input must stay float (algorithms.markers)
        excluded += marked
        log(f"kept float as the model's metadata asks: {', '.join(marked)}")
    if options.per_channel:
        flat = flatten_gemm_biases(model)
        if flat:
            log(f"Gemm biases of shape [1, N] reshaped to [N] (onnxruntime's per-channel "
                f"bias adjustment fails on them): {', '.join(flat)}")
        broken = [n for n in grouped_conv_transposes_with_bias(model) if n not in excluded]
        if broken:
            excluded += broken
            warn(f"kept float (workaround): grouped ConvTranspose with a bias fails in "
                 f"onnxruntime's per-channel quantizer ('operands could not be broadcast "
                 f"together'): {', '.join(broken)}; set per_channel = false to quantize them "
                 f"per-tensor instead")
    for j in joins:
        excluded += [n for n in j.float_nodes if n not in excluded]
        log(f"kept float: Concat '{j.node}' joins ranges {list(j.widths)} (ratio {j.ratio:g} "
            f">= {float_joins_ratio:g}); with {', '.join(j.float_nodes[1:]) or 'nothing else'}")
    extra: dict[str, Any] = dict(options.extra_options)
    extra["ActivationSymmetric"] = options.activation_symmetric
    if options.weight_symmetric is not None:
        extra["WeightSymmetric"] = options.weight_symmetric
    if overrides:
        extra["TensorQuantOverrides"] = overrides
    _guard_dedicated_pairs(model, extra, warn)
    _place_outputs(options, extra)
    wtype = quant_type(options.weight_type, "weight_type", "weight_type")
    atype = quant_type(options.activation_type, "activation_type", "activation_type")

    def build() -> BaseQuantizer:
        if options.quant_format == "qoperator":
            from onnxruntime.quantization.onnx_quantizer import ONNXQuantizer
            from onnxruntime.quantization.quant_utils import QuantizationMode

            return ONNXQuantizer(model, options.per_channel, options.reduce_range,
                                 QuantizationMode.QLinearOps, True, wtype, atype, ranges,
                                 list(options.nodes_to_quantize), excluded, op_types, extra)
        from onnxruntime.quantization.qdq_quantizer import QDQQuantizer

        return QDQQuantizer(model, options.per_channel, options.reduce_range, wtype, atype,
                            ranges, list(options.nodes_to_quantize), excluded, op_types, extra)

    # the box holds the only reference, so that _finish can drop it
    box = [_run_quantizer(build, log, warn, model, model_path)]
    _place_readers(box[0], options, op_types, log)
    settings = {
        "mode": "static",
        "format": options.quant_format,
        "weight_type": options.weight_type,
        "activation_type": options.activation_type,
        "per_channel": options.per_channel,
        "reduce_range": options.reduce_range,
        "activation_symmetric": options.activation_symmetric,
        "weight_symmetric": options.weight_symmetric,
        "preset": options.preset,
        "placement": options.placement,
        "calibration_method": calibration.method,
        "input_model_sha256": calibration.model_sha256,
    }
    if joins:
        settings["float_joins"] = [{"node": j.node, "ratio": j.ratio, "input_widths":
                                    list(j.widths), "float_nodes": list(j.float_nodes),
                                    "reaches_output": j.reaches_output} for j in joins]
    # the quantizer may have edited ``model`` in place: no reference may outlive _finish's
    model = None
    info, report, written = _finish(original, box, output_path, report_path,
                                    _float_bytes(len(data), model_path, original), settings,
                                    had_infer_key)
    if options.per_channel:
        overridden = {n.name for n in written.graph.node
                      if any(i in overrides for i in n.input)}
        _warn_lost_per_channel(report, overridden, warn)
    return info


def _resolve_selectors(options: OptionsT, model: onnx.ModelProto,
                       rewrites: Mapping[str, Any] | None, log: Log) -> OptionsT:
    """``options`` with every node / tensor selector expanded to names on ``model``."""
    changes: dict[str, Any] = {}
    for attr in ("nodes_to_quantize", "nodes_to_exclude"):
        given = getattr(options, attr)
        if given:
            names = tuple(resolve_nodes(given, model, attr, rewrites))
            if list(names) != list(given):
                log(f"{attr}: {len(given)} entr{'y' if len(given) == 1 else 'ies'} select "
                    f"{len(names)} node(s)")
            changes[attr] = names
    node_overrides = getattr(options, "node_overrides", None)
    if node_overrides:
        changes["node_overrides"] = resolve_node_table(node_overrides, model,
                                                       "node_overrides", rewrites)
    tensor_overrides = getattr(options, "tensor_overrides", None)
    if tensor_overrides:
        changes["tensor_overrides"] = resolve_tensors(tensor_overrides, model,
                                                      "tensor_overrides", rewrites)
    return replace(options, **changes) if changes else options


def _place_outputs(options: StaticOptions, extra: dict[str, Any]) -> None:
    """With placement conv_inputs, weighted ops get Q/DQ at their inputs, never after."""
    if options.placement == "conv_inputs":
        extra["OpTypesToExcludeOutputQuantization"] = sorted(
            {*extra.get("OpTypesToExcludeOutputQuantization", []), *CONV_INPUT_OPS})


def _place_readers(quantized: onnx.ModelProto, options: StaticOptions, op_types: list[str],
                   log: Log) -> None:
    """With placement conv_inputs, only weighted ops read quantized activations."""
    if options.placement != "conv_inputs":
        return
    moved = keep_float_readers(quantized, op_types)
    if moved:
        log(f"placement conv_inputs: {moved} reader(s) of quantized activations given the "
            "float tensor")


def _guard_dedicated_pairs(model: onnx.ModelProto, extra: dict[str, Any], warn: Log) -> None:
    # onnxruntime 1.31 with DedicatedQDQPair exports a graph output without its Relu/Clip
    # once it removes that activation (see quantize_validate.check_clamped_outputs).
    if not extra.get("DedicatedQDQPair") or extra.get("QDQKeepRemovableActivations"):
        return
    outputs = {o.name for o in model.graph.output}
    clamps = sorted(n.name or n.output[0] for n in model.graph.node
                    if n.op_type in ("Relu", "Clip") and any(o in outputs for o in n.output))
    if clamps:
        extra["QDQKeepRemovableActivations"] = True
        warn("DedicatedQDQPair with graph outputs made by Relu/Clip "
             f"({', '.join(clamps)}): keeping those activations (QDQKeepRemovableActivations)")


def _override_type_names(options: StaticOptions) -> set[str]:
    found: set[str] = set()
    for table in (options.tensor_overrides, options.node_overrides):
        for value in table.values():
            for entry in value if isinstance(value, (list, tuple)) else [value]:
                for part in (entry, entry.get("convert") or {}):
                    if isinstance(part, dict) and isinstance(part.get("quant_type"), str):
                        found.add(part["quant_type"])
    return found


def quantize_dynamic_model(
    model_path: Path,
    output_path: Path,
    options: DynamicOptions,
    *,
    report_path: Path | None = None,
    log: Log | None = None,
    warn: Log | None = None,
    rewrites: Mapping[str, Any] | None = None,
    latency_in_report: bool = False,
) -> dict[str, Any]:
    """Quantize ``model_path`` dynamically (weights now, activations at run time).

    Writes the quantized model to ``output_path`` (and the report to ``report_path``) and
    returns the info for dependents. Raises ``OnnxError`` for bad input. A result
    clearly slower than the float model is always warned about; ``latency_in_report``
    also records it as ``slower_than_float`` in the report (which then depends on the
    machine, like any timing).
    """
    log = log or (lambda _msg: None)
    warn = warn or log
    check_dynamic_options(options)
    # dropped once used (see below): these models can be large
    model: onnx.ModelProto | None
    original: onnx.ModelProto | None
    written: onnx.ModelProto | None
    data, model = _load(model_path)
    _check_quantizable(model, "dynamic quantization", warn)
    options = _resolve_selectors(options, model, rewrites, log)
    target = required_opset(ai_onnx_opset(model), per_axis=options.per_channel,
                            types={options.weight_type})
    had_infer_key = any(p.key == _INFER_KEY for p in model.metadata_props)
    original = model
    model = _prepare(model, target, log)
    extra: dict[str, Any] = {"MatMulConstBOnly": True, **options.extra_options}
    op_types = sorted(options.op_types or DYNAMIC_OP_TYPES)
    wtype = quant_type(options.weight_type, "weight_type", "weight_type")

    def build() -> BaseQuantizer:
        from onnxruntime.quantization.onnx_quantizer import ONNXQuantizer
        from onnxruntime.quantization.quant_utils import QuantizationMode, QuantType

        return ONNXQuantizer(model, options.per_channel, options.reduce_range,
                             QuantizationMode.IntegerOps, False, wtype, QuantType.QUInt8, None,
                             list(options.nodes_to_quantize), list(options.nodes_to_exclude),
                             op_types, extra)

    # the box holds the only reference, so that _finish can drop it
    box = [_run_quantizer(build, log, warn, model, model_path)]
    settings = {
        "mode": "dynamic",
        "format": "dynamic",
        "weight_type": options.weight_type,
        "activation_type": "uint8",
        "per_channel": options.per_channel,
        "reduce_range": options.reduce_range,
        "input_model_sha256": sha256_bytes(data),
    }
    # the quantizer may have edited ``model`` in place: no reference may outlive _finish's
    model = None
    info, report, written = _finish(original, box, output_path, report_path,
                                    _float_bytes(len(data), model_path, original), settings,
                                    had_infer_key)
    if options.per_channel:
        # onnxruntime's dynamic Conv (ConvInteger) always takes per-tensor weights.
        convs = {n.name for n in written.graph.node if n.op_type == "ConvInteger"}
        _warn_lost_per_channel(report, convs, warn)
    model = written = original = None  # freed: the latency check opens two sessions
    if report["float_model_bytes"] > _LATENCY_CHECK_MAX_BYTES:
        log("latency check skipped: the float model is over 1 GB")
        slower = None
    else:
        slower = _slower_than_float(Path(model_path), Path(output_path), log)
    if slower is not None:
        if latency_in_report and report_path is not None:
            report["slower_than_float"] = slower
            Path(report_path).write_text(json.dumps(report, indent=2, sort_keys=True) + "\n",
                                         encoding="utf-8")
        warn(f"the dynamically quantized model is slower than the float model on this "
             f"machine ({slower['quantized_ms']} ms vs {slower['float_ms']} ms "
             f"{'CPU' if slower['basis'] == 'cpu' else 'wall'} time, 1 thread): "
             "use static quantization or keep the float model")
    return info


_LATENCY_CHECK_MAX_BYTES = 1 << 30
_SLOWER_RATIO = 1.25  # below this, run-to-run noise on a shared CPU could flip the verdict


def _slower_than_float(float_path: Path, quantized_path: Path, log: Log
                       ) -> dict[str, float | str] | None:
    """Latency of both models on one synthetic input, timed interleaved (1 thread, 3
    warm-up rounds, median of 15): a dict when the quantized model is clearly slower in
    CPU time (steady under load from other processes, unlike wall time), else None."""
    import numpy as np
    from onnx import helper
    from qbuild_onnx_common.allocation import check_arrays
    from qbuild_onnx_common.errors import OnnxError
    from qbuild_onnx_common.latency import interleaved_latency_ms, slower_verdict
    from qbuild_onnx_common.ort import session

    try:
        fs, qs = session(float_path), session(quantized_path)
    except OnnxError as exc:
        log(f"latency check skipped: {exc.message}")
        return None
    rng = np.random.default_rng(0)
    feed = {}
    shapes = {i.name: [d if isinstance(d, int) and d > 0 else 1 for d in i.shape]
              for i in fs.get_inputs()}
    try:
        check_arrays("input", {n: (np.float32, s) for n, s in shapes.items()})
    except OnnxError as exc:
        log(f"latency check skipped: {exc.message}")
        return None
    for i in fs.get_inputs():
        shape = shapes[i.name]
        if "float" in i.type:
            dtype = np.float16 if "float16" in i.type else np.float32
            feed[i.name] = rng.standard_normal(shape).astype(dtype)
        else:
            name = i.type[len("tensor("):-1]
            int_dtype = helper.tensor_dtype_to_np_dtype(
                getattr(onnx.TensorProto, name.upper(), onnx.TensorProto.INT64))
            feed[i.name] = np.zeros(shape, int_dtype)
    try:
        lat = interleaved_latency_ms({"float": fs, "quantized": qs}, feed, runs=15, warmup=3)
    except Exception as exc:  # onnxruntime raises several unrelated types on bad feeds
        log(f"latency check skipped: {type(exc).__name__}: {exc}")
        return None
    v = slower_verdict(lat["quantized"], lat["float"])
    f_ms, q_ms = v["reference_ms"], v["ms"]
    log(f"latency (1 thread, interleaved, median of 15, {v['basis']} time): float "
        f"{f_ms:.3f} ms, quantized {q_ms:.3f} ms")
    if q_ms < f_ms * _SLOWER_RATIO:
        return None
    return {"float_ms": round(f_ms, 3), "quantized_ms": round(q_ms, 3),
            "ratio": round(q_ms / f_ms, 2), "basis": v["basis"]}
