"""The ``lower_integer`` rule: a thin wrapper over ``driver.lower_model`` and ``check``.

Imports only qbuild at module level; onnx, onnxruntime and numpy load inside ``run``.
"""

from __future__ import annotations

import json

from qbuild import ActionContext, Rule, attr, dist_version, hookimpl

# Every rule here needs the "onnx" extra (onnx, onnxruntime, numpy).
ONNX_REQUIRES = ("onnx", "onnxruntime", "numpy")
ONNX_INSTALL = "pip install 'qbuild[onnx]'"

REQUANTIZATION = {
    "half_up": "y = clamp(zp + floor((acc*M0 + 2^(shift-1)) / 2^shift))",
    "onnxruntime": "layers with rounding 'onnxruntime': r = floor((acc*M0 + 2^(shift-1)) / "
                   "2^shift), then r -> the even one of r-1, r (r, r+1) when acc*M0/2^shift "
                   "lies within ulp_float32(r -+ 1/2)/2 of r -+ 1/2; y = clamp(zp + r). "
                   "Layers with rounding 'half_up' use the half_up formula; 'table' layers "
                   "index a table (see docs/integer-lowering.md)",
}


class LowerInteger(Rule):
    kind = "lower_integer"
    requires = ONNX_REQUIRES
    install_hint = ONNX_INSTALL
    version = 2
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

    def env(self) -> dict[str, str]:
        return {"onnxruntime": dist_version("onnxruntime"), "onnx": dist_version("onnx"),
                "numpy": dist_version("numpy")}

    def run(self, ctx: ActionContext) -> dict:
        import onnx

        from .check import compare, load_dataset, synthetic_feeds
        from .driver import lower_model
        from .graph import LowerError

        mode = ctx.attrs["mode"]
        onnx_files = [f for f in ctx.attrs["model"].files if f.suffix == ".onnx"]
        if len(onnx_files) != 1:  # quantize/bias_correction also output report.json
            raise ctx.fail(f"{ctx.attrs['model'].label} must have exactly one .onnx output",
                           attr="model")
        src_path = onnx_files[0]
        try:
            source = onnx.load(str(src_path))
            lowered, report, params = lower_model(source, mode, ctx.attrs["rounding"])
            n = ctx.attrs["max_samples"] or None
            if ctx.attrs.get("dataset") is not None:
                feeds = load_dataset(ctx.attrs["dataset"].files[0].parent
                                     if ctx.attrs["dataset"].files[0].is_file()
                                     else ctx.attrs["dataset"].files[0], n)
                inputs = "dataset"
            else:
                feeds, inputs = synthetic_feeds(source, n or 8), "synthetic"
            result = compare(source, lowered, feeds, ctx.attrs["min_agreement"])
        except LowerError as e:
            raise ctx.fail(f"{src_path.name}: {e}", attr="model") from e
        result["inputs"] = inputs
        report = {"source": ctx.attrs["model"].label, **report, "check": result}
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


@hookimpl
def qbuild_rule_types():
    return [LowerInteger]
