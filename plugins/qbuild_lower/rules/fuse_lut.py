"""The rule ``fuse_lut``: on a QDQ model, element-wise chains between quantized tensors
replaced by their tables (``patterns.fuse.fuse_model``), checked bit-exact against the
source."""

from __future__ import annotations

import json

from qbuild_onnx_common.errors import OnnxError
from qbuild_onnx_common.providers import DatasetInfo, OnnxModelInfo, onnx_model_info
from qbuild_onnx_common.rule import OnnxRule

from qbuild import AnalysisContext, RunContext, attr

from .inputs import action_feeds, model_file


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
    from qbuild_onnx_common.models import load_model

    from ..checking.compare import compare
    from ..patterns.fuse import fuse_model

    p = ctx.params
    src_path = model_file(ctx, ctx.inputs["model"], p["source"])
    try:
        source = load_model(src_path)
        fused, fusion = fuse_model(source, p["form"])
        feeds, inputs = action_feeds(ctx, source)
        result = compare(source, fused, feeds, 0.0)
    except OnnxError as e:
        raise ctx.fail(f"{src_path.name}: {e.message}", attr="model") from e
    result["inputs"] = inputs
    report = {"source": p["source"], **fusion, "check": result}
    out = ctx.output(p["model_out"])
    onnx.save(fused, str(out))
    ctx.output("report.json").write_text(json.dumps(report, indent=1, sort_keys=True))
    ctx.log(f"{fusion['regions']} element-wise regions: {fusion['by_form']}; "
            f"{result['exact']:.4%} of output elements bit-exact")
    if result["exact"] < p["min_exact"]:
        raise ctx.fail(f"fused model is bit-exact with its source on {result['exact']:.4%}"
                       f" of output elements, below min_exact {p['min_exact']}",
                       attr="min_exact")
    return onnx_model_info(out, fused)
