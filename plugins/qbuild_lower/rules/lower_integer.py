"""The rule ``lower_integer``: two actions, the lowering (``lowering.driver.lower_model``)
and the check of the lowered model against its QDQ source (``checking``), each cached on
its own. The model is asked for as an ``OnnxModelInfo`` provider and the model written is
given as one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qbuild_onnx_common.arrays import Feed
from qbuild_onnx_common.errors import OnnxError
from qbuild_onnx_common.providers import (
    DatasetInfo,
    OnnxModelInfo,
    onnx_model_info,
)
from qbuild_onnx_common.rule import OnnxRule

from qbuild import AnalysisContext, Dep, RunContext, attr

from .inputs import dataset_dir, model_file

if TYPE_CHECKING:
    import onnx

    from ..profiling.timing import OpProfile

REQUANTIZATION = {
    "half_up": "y = clamp(zp + floor((acc*M0 + 2^(shift-1)) / 2^shift))",
    "onnxruntime": "layers with rounding 'onnxruntime': r = floor((acc*M0 + 2^(shift-1)) / "
                   "2^shift), then r -> the even one of r-1, r (r, r+1) when acc*M0/2^shift "
                   "lies within ulp_float32(r -+ 1/2)/2 of r -+ 1/2; y = clamp(zp + r). "
                   "Layers with rounding 'half_up' use the half_up formula; 'table' layers "
                   "index a table (see docs/integer-lowering.md)",
}


class LowerInteger(OnnxRule):
    kind = "lower_integer"
    version = 5
    doc = (
        "Lower a QDQ model to integer-only arithmetic. mode=ort emits operators onnxruntime "
        "runs (QLinearConv, QLinearMatMul, com.microsoft QLinearAdd/Mul/Concat/Sigmoid/..., "
        "QGemm); mode=fixed_point emits standard ONNX integer ops only, each rescale an "
        "int32 multiplier and a rounding right shift, and writes fixed_point_params.json. "
        "The lowered model is checked against its source in onnxruntime (share of output "
        "elements within +-1 LSB); the build fails below min_agreement. report.json says, "
        "for every node, whether it was lowered or why it stayed in float (lowering.json: "
        "the same without the check). Lowering and check are two actions: changing only "
        "the check's attributes does not lower again."
    )
    heavy = True
    attrs = {
        "model": attr.label(doc="The QDQ model (output of a quantize target).", required=True,
                            providers=[OnnxModelInfo]),
        "mode": attr.enum(["ort", "fixed_point"], default="ort", doc="Target operator set."),
        "tables": attr.enum(
            ["fastest", "table"], default="fastest",
            doc="mode ort: element-wise chains between quantized tensors (SiLU, HardSwish, "
                "GELU, Tanh, compositions) as their 256-entry tables (bit-exact, computed by "
                "onnxruntime from the chain's own nodes). fastest = the identity, a "
                "matching QLinearSigmoid/QLinearLeakyRelu, or the QLinear ops the chain "
                "already lowers to when cheaper than a table; table = always a table."),
        "profile_runs": attr.int(default=0, doc="> 0: profile the lowered model with "
                                 "onnxruntime (1 thread, this many runs) and list in "
                                 "report.json the time of every op type and of the nodes "
                                 "left in float (timings make the report not reproducible)."),
        "dataset": attr.label(doc="qbuild dataset for the check; without it, seeded random "
                                  "inputs over each input's quantization range.",
                              providers=[DatasetInfo]),
        "min_agreement": attr.float(default=0.999, doc="Minimum share of output elements "
                                                       "within +-1 LSB of the QDQ source."),
        "max_samples": attr.int(default=8, doc="Samples used by the check (0 = all)."),
        "rounding": attr.enum(
            ["half_up", "onnxruntime"], default="half_up",
            doc="fixed_point requantization (mode ort ignores it): half_up = one "
                "rounding of acc*M0/2^shift, half up (Jacob et al.; what integer hardware "
                "does); onnxruntime = the same "
                "integers corrected to onnxruntime's float32 rounding, and Add/Mul/Concat "
                "rescales as tables onnxruntime computed: bit-exact with the QDQ source."),
        "float_model": attr.enum(
            ["fail", "copy"], default="fail",
            doc="A model with no QuantizeLinear/DequantizeLinear (nothing to lower): fail, "
                "or copy it unchanged (auto_quantize's lowered trials, whose source may "
                "keep every node float; report.json says so)."),
    }
    outputs = ["{name}.onnx", "report.json", "lowering.json"]
    provides = (OnnxModelInfo,)

    def declared_outputs(self, name: str, attrs: Mapping[str, Any]) -> list[str]:
        outs = [f"{name}.onnx", "report.json", "lowering.json"]
        if attrs.get("mode") == "fixed_point":
            outs.append("fixed_point_params.json")
        return outs

    def is_reproducible(self, attrs: Mapping[str, Any]) -> bool:
        return not attrs.get("profile_runs")  # measured timings differ run to run

    def analyze(self, ctx: AnalysisContext) -> None:
        a = ctx.attrs
        model = f"{ctx.name}.onnx"
        made = [model, "lowering.json"] + (["fixed_point_params.json"]
                                           if a["mode"] == "fixed_point" else [])
        # Two actions, each cached on its own: the check's settings (min_agreement,
        # max_samples, dataset, profile_runs) do not lower the model again.
        ctx.action(lower_integer, inputs=["model"], outputs=made, mnemonic="Lower",
                   params={"model_out": model, "mode": a["mode"], "tables": a["tables"],
                           "rounding": a["rounding"], "float_model": a["float_model"]})
        ctx.action(check_lowered, inputs=["model", "dataset", model, "lowering.json"],
                   outputs=["report.json"], mnemonic="Check",
                   params={"source": a["model"], "model_out": model,
                           **{k: a[k] for k in ("profile_runs", "min_agreement",
                                                "max_samples")}})


def lower_integer(ctx: RunContext) -> OnnxModelInfo:
    """The first action of ``lower_integer``: lower the QDQ model."""
    import onnx
    from qbuild_onnx_common.models import load_model

    from ..lowering.driver import lower_model

    p = ctx.params
    src_path = model_file(ctx, ctx.inputs["model"], "the model")
    source = load_model(src_path)
    if p["float_model"] == "copy" and p["mode"] == "ort" and not _has_qdq(source):
        return _copy_float(ctx, src_path, source)
    try:
        lowered, report, params = lower_model(source, p["mode"], p["rounding"], p["tables"])
    except OnnxError as e:
        raise ctx.fail(f"{src_path.name}: {e.message}", attr="model") from e
    out = ctx.output(p["model_out"])
    onnx.save(lowered, str(out))
    ctx.output("lowering.json").write_text(json.dumps(report, indent=1, sort_keys=True))
    if p["mode"] == "fixed_point":
        ctx.output("fixed_point_params.json").write_text(json.dumps(
            {"format": "qbuild-fixed-point", "version": 2,
             "rounding": p["rounding"],
             "requantization": REQUANTIZATION[p["rounding"]],
             "layers": params}, indent=1, sort_keys=True))
    ctx.log(f"lowered {report['nodes']['lowered']}/{report['nodes']['compute']} nodes")
    for entry in report["per_node"]:
        if entry["status"] == "float":
            ctx.log(f"float: {entry['node']} ({entry['op_type']}): {entry['reason']}")
    return onnx_model_info(out, lowered, **_recorded(ctx.inputs["model"]))


def _recorded(dep: Dep) -> dict[str, tuple[str, ...]]:
    """What the source's quantize recorded (tensors kept float or promoted, joins kept
    float), passed on: lowering changes operators, not those decisions."""
    info = dep.get(OnnxModelInfo) if OnnxModelInfo in dep else None
    if info is None:
        return {}
    return {"promoted": info.promoted, "float_joins": info.float_joins}


def _has_qdq(model: onnx.ModelProto) -> bool:
    ops = {n.op_type for n in model.graph.node}
    return "QuantizeLinear" in ops and "DequantizeLinear" in ops


def _copy_float(ctx: RunContext, src_path: Path, source: onnx.ModelProto) -> OnnxModelInfo:
    """``float_model = "copy"``: nothing to lower; the model is copied unchanged."""
    import shutil

    out = ctx.output(ctx.params["model_out"])
    shutil.copyfile(src_path, out)
    note = "the model has no QuantizeLinear/DequantizeLinear nodes: copied unchanged"
    ctx.output("lowering.json").write_text(json.dumps(
        {"copied": note, "nodes": {"lowered": 0, "compute": 0}, "per_node": []},
        indent=1, sort_keys=True))
    ctx.log(note)
    return onnx_model_info(out, source, **_recorded(ctx.inputs["model"]))


def check_lowered(ctx: RunContext) -> None:
    """The second action of ``lower_integer``: compare the lowered model with its QDQ
    source in onnxruntime, write report.json, fail below min_agreement."""
    from qbuild_onnx_common.models import load_model

    from ..checking.compare import compare
    from ..checking.feeds import load_dataset, synthetic_feeds

    p = ctx.params
    src_path = model_file(ctx, ctx.inputs["model"], p["source"])
    lowering = json.loads(ctx.inputs["lowering.json"].read_text())
    if "copied" in lowering:  # the same bytes as the source: nothing to check
        ctx.output("report.json").write_text(json.dumps(
            {"source": p["source"], **lowering, "check": {"passed": True, "exact": True}},
            indent=1, sort_keys=True))
        return
    try:
        source = load_model(src_path)
        lowered = load_model(ctx.inputs[p["model_out"]])
        n = p["max_samples"] or None
        if ctx.inputs["dataset"] is not None:
            feeds = load_dataset(dataset_dir(ctx), n, source)
            inputs = "dataset"
        else:
            feeds, inputs = synthetic_feeds(source, n or 8), "synthetic"
        result = compare(source, lowered, feeds, p["min_agreement"])
    except OnnxError as e:
        raise ctx.fail(f"{src_path.name}: {e.message}", attr="model") from e
    result["inputs"] = inputs
    report = {"source": p["source"], **lowering, "check": result}
    if p["profile_runs"] > 0:
        report["profile"] = _unfused_cost(lowered, report, feeds[0], p["profile_runs"])
    ctx.output("report.json").write_text(json.dumps(report, indent=1, sort_keys=True))
    ctx.log(f"{result['within_1lsb']:.4%} within 1 LSB, max {result['max_error_lsb']} LSB")
    if not result["passed"]:
        raise ctx.fail(
            f"lowered model agrees with its QDQ source on {result['within_1lsb']:.4%} of "
            f"output elements within 1 LSB, below min_agreement "
            f"{p['min_agreement']:.4%} (max error {result['max_error_lsb']} LSB)",
            attr="min_agreement")


def _unfused_cost(lowered: onnx.ModelProto, report: Mapping[str, Any], feed: Feed,
                  runs: int) -> dict[str, Any]:
    """onnxruntime's profile of the lowered model, and what the nodes left in float (and
    the element-wise chains kept as they were) cost in it."""
    from ..profiling.timing import op_profile

    prof: OpProfile = op_profile(lowered, feed, threads=1, runs=runs, top=15, all_nodes=True)
    floats = [e for e in report["per_node"] if e["status"] == "float"]
    by_node = prof.pop("node_ms")
    unfused = [{"node": e["node"], "op_type": e["op_type"], "category": e["category"],
                "ms": by_node.get(e["node"])} for e in floats]
    return {**prof, "threads": 1, "unfused": unfused,
            "unfused_ms": round(sum(u["ms"] or 0.0 for u in unfused), 4)}


