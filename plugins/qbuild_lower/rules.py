"""The ``lower_integer`` rule: a thin wrapper over ``driver.lower_model`` and ``check``.

Imports only qbuild at module level; onnx, onnxruntime and numpy load inside ``run``.
"""

from __future__ import annotations

import json

from qbuild_onnx_common.files import dataset_dir, model_file
from qbuild_onnx_common.rule import OnnxRule

from qbuild import ActionContext, attr, hookimpl

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
        "for every node, whether it was lowered or why it stayed in float."
    )
    heavy = True
    attrs = {
        "model": attr.label(doc="The QDQ model (output of a quantize target).", required=True),
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
                                  "inputs over each input's quantization range."),
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
    }
    outputs = ["{name}.onnx", "report.json"]

    def declared_outputs(self, name, attrs):
        outs = [f"{name}.onnx", "report.json"]
        if attrs.get("mode") == "fixed_point":
            outs.append("fixed_point_params.json")
        return outs

    def is_reproducible(self, attrs) -> bool:
        return not attrs.get("profile_runs")  # measured timings differ run to run

    def run(self, ctx: ActionContext) -> dict:
        import onnx
        from qbuild_onnx_common.errors import OnnxError

        from .check import compare, load_dataset, synthetic_feeds
        from .driver import lower_model

        mode = ctx.attrs["mode"]
        src_path = model_file(ctx, ctx.attrs["model"], "model")
        try:
            source = onnx.load(str(src_path))
            lowered, report, params = lower_model(source, mode, ctx.attrs["rounding"],
                                                  ctx.attrs["tables"])
            n = ctx.attrs["max_samples"] or None
            if ctx.attrs.get("dataset") is not None:
                feeds = load_dataset(dataset_dir(ctx, ctx.attrs["dataset"], "dataset"), n)
                inputs = "dataset"
            else:
                feeds, inputs = synthetic_feeds(source, n or 8), "synthetic"
            result = compare(source, lowered, feeds, ctx.attrs["min_agreement"])
        except OnnxError as e:
            raise ctx.fail(f"{src_path.name}: {e.message}", attr="model") from e
        result["inputs"] = inputs
        report = {"source": ctx.attrs["model"].label, **report, "check": result}
        if ctx.attrs["profile_runs"] > 0:
            report["profile"] = _unfused_cost(lowered, report, feeds[0],
                                              ctx.attrs["profile_runs"])
        out = ctx.output(f"{ctx.name}.onnx")
        onnx.save(lowered, str(out))
        ctx.output("report.json").write_text(json.dumps(report, indent=1, sort_keys=True))
        if mode == "fixed_point":
            ctx.output("fixed_point_params.json").write_text(json.dumps(
                {"format": "qbuild-fixed-point", "version": 2,
                 "rounding": ctx.attrs["rounding"],
                 "requantization": REQUANTIZATION[ctx.attrs["rounding"]],
                 "layers": params}, indent=1, sort_keys=True))
        ctx.log(f"lowered {report['nodes']['lowered']}/{report['nodes']['compute']} nodes; "
                f"{result['within_1lsb']:.4%} within 1 LSB, max {result['max_error_lsb']} LSB")
        for e in report["per_node"]:
            if e["status"] == "float":
                ctx.log(f"float: {e['node']} ({e['op_type']}): {e['reason']}")
        if not result["passed"]:
            raise ctx.fail(
                f"lowered model agrees with its QDQ source on {result['within_1lsb']:.4%} of "
                f"output elements within 1 LSB, below min_agreement "
                f"{ctx.attrs['min_agreement']:.4%} (max error {result['max_error_lsb']} LSB)",
                attr="min_agreement")
        return {"mode": mode, "lowered_share": report["nodes"]["lowered_share"],
                "within_1lsb": result["within_1lsb"], "max_error_lsb": result["max_error_lsb"]}


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
        "model": attr.label(doc="The QDQ model.", required=True),
        "form": attr.enum(["fastest", "table"], default="fastest", doc="See the rule doc."),
        "dataset": attr.label(doc="qbuild dataset for the check; without it, seeded random "
                                  "inputs over each input's quantization range."),
        "max_samples": attr.int(default=4, doc="Samples used by the check (0 = all)."),
        "min_exact": attr.float(default=1.0, doc="Minimum share of output elements equal "
                                                 "to the source's."),
    }
    outputs = ["{name}.onnx", "report.json"]

    def run(self, ctx: ActionContext) -> dict:
        import onnx
        from qbuild_onnx_common.errors import OnnxError

        from .check import compare
        from .fuse import fuse_model

        src_path = model_file(ctx, ctx.attrs["model"], "model")
        try:
            source = onnx.load(str(src_path))
            fused, report = fuse_model(source, ctx.attrs["form"])
            feeds, inputs = _feeds(ctx, source)
            result = compare(source, fused, feeds, 0.0)
        except OnnxError as e:
            raise ctx.fail(f"{src_path.name}: {e.message}", attr="model") from e
        result["inputs"] = inputs
        report = {"source": ctx.attrs["model"].label, **report, "check": result}
        onnx.save(fused, str(ctx.output(f"{ctx.name}.onnx")))
        ctx.output("report.json").write_text(json.dumps(report, indent=1, sort_keys=True))
        ctx.log(f"{report['regions']} element-wise regions: {report['by_form']}; "
                f"{result['exact']:.4%} of output elements bit-exact")
        if result["exact"] < ctx.attrs["min_exact"]:
            raise ctx.fail(f"fused model is bit-exact with its source on {result['exact']:.4%}"
                           f" of output elements, below min_exact {ctx.attrs['min_exact']}",
                           attr="min_exact")
        return {"regions": report["regions"], "by_form": report["by_form"],
                "exact": result["exact"]}


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
        "models": attr.label_list(doc="Model targets (one .onnx output each).", required=True),
        "reference": attr.label(doc="The float model the others are compared with "
                                    "(default: the first of models)."),
        "dataset": attr.label(doc="qbuild dataset (first sample is timed); without it, "
                                  "seeded random inputs."),
        "threads": attr.int(default=1, doc="onnxruntime intra-op threads."),
        "runs": attr.int(default=30, doc="Timed interleaved rounds."),
        "warmup": attr.int(default=5, doc="Untimed rounds first."),
        "profile_runs": attr.int(default=10, doc="Runs under onnxruntime's profiler "
                                                 "(0: no per-op profile)."),
        "top": attr.int(default=15, doc="Top nodes listed per model."),
    }
    outputs = ["report.json", "report.md"]

    def run(self, ctx: ActionContext) -> dict:
        import onnx

        from .profiling import conditions, interleaved_latency, macs, op_profiles, render

        a = ctx.attrs
        if a["threads"] < 1 or a["runs"] < 1:
            raise ctx.fail("threads and runs must be >= 1", attr="threads" if a["threads"] < 1
                           else "runs")
        deps = list(a["models"])
        ref = a["reference"]
        if ref is not None and ref.label not in {d.label for d in deps}:
            deps.insert(0, ref)
        ref_label = ref.label if ref is not None else deps[0].label
        paths = {d.label: model_file(ctx, d, "models") for d in deps}
        first = onnx.load(str(paths[ref_label]))
        feeds, inputs = _feeds(ctx, first, count=1)
        before = conditions()
        lat = interleaved_latency(paths, feeds[0], a["threads"], a["runs"], a["warmup"],
                                  reference=ref_label)
        report = {"reference": ref_label, "inputs": inputs, "latency": lat, "models": {}}
        profs = (op_profiles(paths, feeds[0], a["threads"], a["profile_runs"], a["warmup"],
                             a["top"]) if a["profile_runs"] > 0 else {})
        for label, p in paths.items():
            entry = {"macs": macs(onnx.load(str(p)))}
            if label in profs:
                entry["profile"] = profs[label]
            report["models"][label] = entry
        report["conditions"] = {"before": before, "after": conditions()}
        ctx.output("report.json").write_text(json.dumps(report, indent=1, sort_keys=True))
        ctx.output("report.md").write_text(render(report))
        for label, m in lat["models"].items():
            if m.get("slower_than_reference"):
                ctx.warn(f"{label} is slower than {ref_label}: {m['median_ms']} vs "
                         f"{lat['models'][ref_label]['median_ms']} ms ({a['threads']} thread(s))")
        if lat["noisy"]:
            ctx.warn("noisy measurement: an interquartile range exceeds 10 % of its median")
        return {"speedups": {k: v["speedup"] for k, v in lat["models"].items()}}


def _feeds(ctx: ActionContext, model, count: int | None = None):
    from .check import load_dataset, random_feeds

    n = count or ctx.attrs.get("max_samples") or None
    ds = ctx.attrs.get("dataset")
    if ds is not None:
        return load_dataset(dataset_dir(ctx, ds, "dataset"), n), "dataset"
    return random_feeds(model, n or 4), "synthetic"


@hookimpl
def qbuild_rule_types():
    return [LowerInteger, FuseLut, Profile]
