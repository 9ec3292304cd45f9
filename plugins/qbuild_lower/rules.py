"""The rules ``lower_integer``, ``fuse_lut`` and ``profile`` (rule API v2): each declares
one action at analysis, a thin wrapper over ``driver.lower_model``, ``fuse.fuse_model``
or ``profiling``. Models are asked for as ``OnnxModelInfo`` providers and the model
written is given as one.

Imports only qbuild and the shared providers at module level; onnx, onnxruntime and
numpy load inside the actions.
"""

from __future__ import annotations

import json

from qbuild_onnx_common.errors import OnnxError
from qbuild_onnx_common.providers import (
    DatasetInfo,
    OnnxModelInfo,
    dataset_path,
    model_path,
    onnx_model_info,
)
from qbuild_onnx_common.rule import OnnxRule

from qbuild import AnalysisContext, RunContext, attr, hookimpl

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

    def declared_outputs(self, name, attrs):
        outs = [f"{name}.onnx", "report.json", "lowering.json"]
        if attrs.get("mode") == "fixed_point":
            outs.append("fixed_point_params.json")
        return outs

    def is_reproducible(self, attrs) -> bool:
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

    from .driver import lower_model

    p = ctx.params
    src_path = _model_path(ctx, ctx.inputs["model"], "the model")
    source = onnx.load(str(src_path))
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
    for e in report["per_node"]:
        if e["status"] == "float":
            ctx.log(f"float: {e['node']} ({e['op_type']}): {e['reason']}")
    return onnx_model_info(out, lowered, **_recorded(ctx.inputs["model"]))


def _recorded(dep) -> dict:
    """What the source's quantize recorded (tensors kept float or promoted, joins kept
    float), passed on: lowering changes operators, not those decisions."""
    info = dep.get(OnnxModelInfo) if OnnxModelInfo in dep else None
    if info is None:
        return {}
    return {"promoted": info.promoted, "float_joins": info.float_joins}


def _has_qdq(model) -> bool:
    ops = {n.op_type for n in model.graph.node}
    return "QuantizeLinear" in ops and "DequantizeLinear" in ops


def _copy_float(ctx: RunContext, src_path, source) -> OnnxModelInfo:
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
    import onnx

    from .check import compare, load_dataset, synthetic_feeds

    p = ctx.params
    src_path = _model_path(ctx, ctx.inputs["model"], p["source"])
    lowering = json.loads(ctx.inputs["lowering.json"].read_text())
    if "copied" in lowering:  # the same bytes as the source: nothing to check
        ctx.output("report.json").write_text(json.dumps(
            {"source": p["source"], **lowering, "check": {"passed": True, "exact": True}},
            indent=1, sort_keys=True))
        return
    try:
        source = onnx.load(str(src_path))
        lowered = onnx.load(str(ctx.inputs[p["model_out"]]))
        n = p["max_samples"] or None
        if ctx.inputs["dataset"] is not None:
            feeds = load_dataset(_dataset_dir(ctx), n, source)
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


def _unfused_cost(lowered, report: dict, feed: dict, runs: int) -> dict:
    """onnxruntime's profile of the lowered model, and what the nodes left in float (and
    the element-wise chains kept as they were) cost in it."""
    from .profiling import op_profile

    prof = op_profile(lowered, feed, threads=1, runs=runs, top=15, all_nodes=True)
    floats = [e for e in report["per_node"] if e["status"] == "float"]
    by_node = prof.pop("node_ms")
    unfused = [{"node": e["node"], "op_type": e["op_type"], "category": e["category"],
                "ms": by_node.get(e["node"])} for e in floats]
    return {**prof, "threads": 1, "unfused": unfused,
            "unfused_ms": round(sum(u["ms"] or 0.0 for u in unfused), 4)}


class FuseLut(OnnxRule):
    kind = "fuse_lut"
    version = 3
    doc = (
        "On a QDQ model (right after quantize): every chain of element-wise ops between two "
        "quantized tensors (SiLU, HardSwish, Sigmoid, Tanh, GELU, LeakyRelu, Clip and "
        "compositions) is replaced by its 256-entry table indexed by the 8-bit code "
        "(Cast + GatherElements), computed by onnxruntime running the chain's own "
        "DQ -> ops -> Q, so the result is bit-exact with the input model. form = fastest "
        "uses instead the identity or a matching com.microsoft QLinearSigmoid/"
        "QLinearLeakyRelu when the table equals theirs, and keeps a chain that onnxruntime "
        "runs faster as it is (report.json says which and why). The model is checked "
        "against its source (bit-exact share must reach min_exact)."
    )
    heavy = True
    attrs = {
        "model": attr.label(doc="The QDQ model.", required=True, providers=[OnnxModelInfo]),
        "form": attr.enum(["fastest", "table"], default="fastest", doc="See the rule doc."),
        "dataset": attr.label(doc="qbuild dataset for the check; without it, seeded random "
                                  "inputs over each input's quantization range.",
                              providers=[DatasetInfo]),
        "max_samples": attr.int(default=4, doc="Samples used by the check (0 = all)."),
        "min_exact": attr.float(default=1.0, doc="Minimum share of output elements equal "
                                                 "to the source's."),
    }
    outputs = ["{name}.onnx", "report.json"]

    provides = (OnnxModelInfo,)

    def analyze(self, ctx: AnalysisContext) -> None:
        a = ctx.attrs
        ctx.action(fuse_lut, inputs=["model", "dataset"], outputs=ctx.outputs,
                   mnemonic="FuseLut",
                   params={"source": a["model"], "model_out": f"{ctx.name}.onnx",
                           "form": a["form"], "max_samples": a["max_samples"],
                           "min_exact": a["min_exact"]})


def fuse_lut(ctx: RunContext) -> OnnxModelInfo:
    """The action of ``fuse_lut``: fuse, check bit-exactness, report."""
    import onnx

    from .check import compare
    from .fuse import fuse_model

    p = ctx.params
    src_path = _model_path(ctx, ctx.inputs["model"], p["source"])
    try:
        source = onnx.load(str(src_path))
        fused, report = fuse_model(source, p["form"])
        feeds, inputs = _feeds(ctx, source)
        result = compare(source, fused, feeds, 0.0)
    except OnnxError as e:
        raise ctx.fail(f"{src_path.name}: {e.message}", attr="model") from e
    result["inputs"] = inputs
    report = {"source": p["source"], **report, "check": result}
    out = ctx.output(p["model_out"])
    onnx.save(fused, str(out))
    ctx.output("report.json").write_text(json.dumps(report, indent=1, sort_keys=True))
    ctx.log(f"{report['regions']} element-wise regions: {report['by_form']}; "
            f"{result['exact']:.4%} of output elements bit-exact")
    if result["exact"] < p["min_exact"]:
        raise ctx.fail(f"fused model is bit-exact with its source on {result['exact']:.4%}"
                       f" of output elements, below min_exact {p['min_exact']}",
                       attr="min_exact")
    return onnx_model_info(out, fused)


class Profile(OnnxRule):
    kind = "profile"
    machine_dependent = True  # measures this machine's kernels
    reproducible = False  # timings
    version = 3
    doc = (
        "Where the time goes: every model timed interleaved with the others in one process "
        "(warm-ups, `threads` intra-op threads, median, quartiles, spread; noisy runs and "
        "models slower than the reference are flagged), and onnxruntime's profiler per "
        "model (its runs interleaved too): time per op type and the top nodes, side by "
        "side in report.md, with each model's multiply-accumulate count. Timings make the "
        "report not reproducible."
    )
    heavy = True
    attrs = {
        "models": attr.label_list(doc="Model targets (one .onnx output each).", required=True,
                                  providers=[OnnxModelInfo]),
        "reference": attr.label(doc="The float model the others are compared with "
                                    "(default: the first of models).",
                                providers=[OnnxModelInfo]),
        "dataset": attr.label(doc="qbuild dataset (first sample is timed); without it, "
                                  "seeded random inputs.", providers=[DatasetInfo]),
        "threads": attr.int(default=1, doc="onnxruntime intra-op threads."),
        "runs": attr.int(default=30, doc="Timed interleaved rounds."),
        "warmup": attr.int(default=5, doc="Untimed rounds first."),
        "profile_runs": attr.int(default=10, doc="Runs under onnxruntime's profiler "
                                                 "(0: no per-op profile)."),
        "top": attr.int(default=15, doc="Top nodes listed per model."),
    }
    outputs = ["report.json", "report.md"]

    def validate(self, attrs) -> None:
        from qbuild import ConfigError

        for name in ("threads", "runs"):
            if attrs[name] < 1:
                raise ConfigError("threads and runs must be >= 1", attr=name)

    def analyze(self, ctx: AnalysisContext) -> None:
        a = ctx.attrs
        # Models are named by label in the report: the labels are declared params.
        ctx.action(profile, inputs=["models", "reference", "dataset"], outputs=ctx.outputs,
                   mnemonic="Profile",
                   params={"models": a["models"], "reference": a["reference"],
                           **{k: a[k] for k in ("threads", "runs", "warmup",
                                                "profile_runs", "top")}})


def profile(ctx: RunContext) -> None:
    """The action of ``profile``: interleaved latency and per-op profiles."""
    import onnx
    from qbuild_onnx_common.latency import slower_verdict

    from .profiling import conditions, interleaved_latency, macs, op_profiles, render

    p = ctx.params
    deps = dict(zip(p["models"], ctx.inputs["models"]))
    if p["reference"] is not None and p["reference"] not in deps:
        deps = {p["reference"]: ctx.inputs["reference"], **deps}
    ref_label = p["reference"] if p["reference"] is not None else next(iter(deps))
    paths = {label: _model_path(ctx, dep, label, "models") for label, dep in deps.items()}
    first = onnx.load(str(paths[ref_label]))
    feeds, inputs = _feeds(ctx, first, count=1)
    before = conditions()
    lat = interleaved_latency(paths, feeds[0], p["threads"], p["runs"], p["warmup"],
                              reference=ref_label)
    report = {"reference": ref_label, "inputs": inputs, "latency": lat, "models": {}}
    profs = (op_profiles(paths, feeds[0], p["threads"], p["profile_runs"], p["warmup"],
                         p["top"]) if p["profile_runs"] > 0 else {})
    for label, path in paths.items():
        entry = {"macs": macs(onnx.load(str(path)))}
        if label in profs:
            entry["profile"] = profs[label]
        report["models"][label] = entry
    report["conditions"] = {"before": before, "after": conditions()}
    ctx.output("report.json").write_text(json.dumps(report, indent=1, sort_keys=True))
    ctx.output("report.md").write_text(render(report))
    for label, m in lat["models"].items():
        if m.get("slower_than_reference"):
            v = slower_verdict(m, lat["models"][ref_label])
            ctx.warn(f"{label} is slower than {ref_label}: {v['ms']} vs {v['reference_ms']} "
                     f"ms {'CPU' if v['basis'] == 'cpu' else 'wall'} time, median "
                     f"({p['threads']} thread(s))")
    if lat["noisy"]:
        ctx.warn("noisy measurement: an interquartile range exceeds 10 % of its median")


def _model_path(ctx: RunContext, dep, label: str, attr_name: str = "model"):
    try:
        return model_path(dep)
    except ValueError as e:
        raise ctx.fail(f"{label} {e}", attr=attr_name) from None


def _dataset_dir(ctx: RunContext):
    try:
        path = dataset_path(ctx.inputs["dataset"])
    except ValueError as e:
        raise ctx.fail(f"the dataset {e}", attr="dataset") from None
    return path.parent if path.is_file() else path


def _feeds(ctx: RunContext, model, count: int | None = None):
    import onnx

    from .check import load_dataset, random_feeds

    n = count or ctx.params.get("max_samples") or None
    if ctx.inputs.get("dataset") is not None:
        m = model if isinstance(model, onnx.ModelProto) else onnx.load(str(model))
        return load_dataset(_dataset_dir(ctx), n, m), "dataset"
    return random_feeds(model, n or 4), "synthetic"


@hookimpl
def qbuild_rule_types():
    return [LowerInteger, FuseLut, Profile]
