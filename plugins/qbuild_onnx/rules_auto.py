"""``auto_quantize`` (a macro: its trials are ordinary cached targets, see ``auto_plan``;
the target itself selects, see ``auto_select``) and ``sensitive_region`` (the stem or
head region around the most sensitive activation, as quantize overrides). Registered by
``rules_accuracy``'s hook; heavy imports happen inside ``run``.
"""

from __future__ import annotations

import json
import math
from typing import Any

from qbuild import ActionContext, ConfigError, Rule, attr, dist_version


def _env() -> dict[str, str]:
    return {"onnxruntime": dist_version("onnxruntime"), "onnx": dist_version("onnx"),
            "numpy": dist_version("numpy")}


def _clean(x: Any) -> Any:
    """JSON-ready: infinities as strings, floats rounded."""
    if isinstance(x, float):
        if math.isinf(x) or math.isnan(x):
            return str(x)
        return round(x, 6)
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_clean(v) for v in x]
    return x


class SensitiveRegion(Rule):
    kind = "sensitive_region"
    version = 1
    heavy = True
    doc = ("Writes overrides.json keeping a whole region float: the nodes from the graph's "
           "start to the consumers of the `rank`-th most sensitive activation of a "
           "`sensitivity` report (the stem) when it sits in the first half of the graph, "
           "else from its producer to the end (the head). Also lists the region as a "
           "stable selector string. Use it as quantize's `overrides`.")
    attrs = {
        "model": attr.label(doc="The float model the quantize target quantizes.",
                            required=True),
        "sensitivity": attr.label(doc="A sensitivity target.", required=True),
        "rank": attr.int(default=0, doc="Which ranked activation (0: the most sensitive)."),
        "count": attr.int(default=1, doc="Union of the regions of this many activations "
                          "ranked from `rank` on."),
    }
    outputs = ["overrides.json"]

    def env(self) -> dict[str, str]:
        return _env()

    def run(self, ctx: ActionContext) -> dict[str, Any]:
        from .accuracy_metrics import AccuracyError
        from .auto_regions import region_overrides

        a = ctx.attrs
        model = next(f for f in a["model"].files if f.suffix == ".onnx")
        rep = json.loads(a["sensitivity"].output("sensitivity.json").read_text())
        try:
            doc = region_overrides(model, rep, a["rank"], a["count"])
        except AccuracyError as e:
            raise ctx.fail(str(e), attr="sensitivity") from None
        ctx.output("overrides.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        ctx.log(f"region {doc['region']['where']} around {doc['region']['tensor']}: "
                f"{doc['region']['nodes']} node(s) float")
        return {"region": doc["region"], "selectors": doc["selectors"]}


class AutoQuantize(Rule):
    kind = "auto_quantize"
    version = 1
    heavy = False
    doc = ("Automatic quantization search, as a macro: expands to calibrate / quantize / "
           "bias_correction / sensitivity / mixed_precision / sensitive_region trials, each "
           "with an evaluate target (named <name>.<trial>, <name>.ev_<trial>), all ordinary "
           "cached targets; this target picks the cheapest trial (objective: measured "
           "latency or size) that meets every `bar`, or keeps the float model when none is "
           "cheaper, and writes {name}.onnx, report.json and report.html. Changing the bar "
           "or objective reruns only this selection.")
    attrs = {
        "model": attr.label(doc="The float model (pre-processed).", required=True),
        "calibration_data": attr.label(doc="Dataset to calibrate (and rank sites) on.",
                                       required=True),
        "evaluation_data": attr.label(doc="Dataset the trials are judged on.", required=True),
        "task": attr.string(default="sqnr", doc="Evaluation task (see evaluate)."),
        "task_options": attr.mapping(default={}, doc="Options of the task."),
        "metric_srcs": attr.files(doc="Files of a custom metric."),
        "bar": attr.mapping(required=True, doc="What a trial must meet: min_f1, min_ap50, "
                            "max_top1_drop, min_top1_agreement, min_sqnr_db, min_psnr_db, "
                            "min_score."),
        "objective": attr.enum(["latency", "size"], default="latency",
                               doc="Cost of a trial: its measured 1-thread latency or its "
                                   "size in bytes."),
        "latency_runs": attr.int(default=20, doc="Timed runs per trial's evaluate."),
        "calibration_methods": attr.string_list(default=["minmax", "percentile"],
                                                doc="Calibration methods tried."),
        "steps": attr.string_list(default=["activation_type", "per_channel", "calibration",
                                           "cle", "bias_correction", "region",
                                           "float_top_k", "uint16_top_k"],
                                  doc="Which trial families (cle: cross-layer equalization; "
                                      "\"adaround\", learned weight rounding, is not in the "
                                      "default: it costs minutes and kept no layer on "
                                      "MobileNetV2, BENCHMARKS.md)."),
        "adaround_options": attr.mapping(default={}, doc="Attributes of the adaround trials "
                                         "(rows, iterations, max_samples, ...)."),
        "top_k": attr.int_list(default=[2, 8], doc="Sensitive activations kept float / "
                               "promoted to 16 bits per trial."),
        "sensitivity_samples": attr.int(default=4, doc="Samples the sensitivity uses."),
        "candidates": attr.label_list(doc="(filled in by the expansion)"),
        "reports": attr.label_list(doc="(filled in by the expansion)"),
        "trial_names": attr.string_list(default=[], doc="(filled in by the expansion)"),
        "sensitivity": attr.label(doc="(filled in by the expansion)"),
    }
    outputs = ["{name}.onnx", "report.json", "report.html"]

    @staticmethod
    def expand_targets(name: str, raw: dict[str, Any]):
        from .auto_plan import expand

        return expand(name, raw)

    def validate(self, attrs: dict[str, Any]) -> None:
        from .auto_select import check_bar

        problems = check_bar(attrs["bar"] or {})
        if problems:
            raise ConfigError(problems[0], attr="bar")
        if not attrs["bar"]:
            raise ConfigError("give at least one bar, e.g. bar = { min_sqnr_db = 30 }",
                              attr="bar")

    def run(self, ctx: ActionContext) -> dict[str, Any]:
        import shutil

        from .auto_select import select
        from .report_html import auto_html

        a = ctx.attrs
        reports, entries = [], []
        for dep, cand in zip(a["reports"], a["candidates"], strict=True):
            rep = json.loads(dep.output("report.json").read_text())
            reports.append(rep)
            entries.append(rep["models"][cand.label])
        result = select(a["trial_names"], entries, reports, a["bar"], a["objective"],
                        a["model"].label)
        for row, cand in zip(result["trials"], a["candidates"]):
            row["model"] = cand.label
            row["float_nodes"] = len(cand.info.get("promoted", []))
            joins = cand.info.get("float_joins") or []
            if joins:
                row["float_joins"] = [j["node"] for j in joins]
        result = _clean(result)
        if result["chosen"] == "float":
            src = next(f for f in a["model"].files if f.suffix == ".onnx")
        else:
            index = a["trial_names"].index(result["chosen"])
            src = next(f for f in a["candidates"][index].files if f.suffix == ".onnx")
        shutil.copyfile(src, ctx.output("{name}.onnx"))
        sens = None
        if a["sensitivity"] is not None:
            sens = json.loads(a["sensitivity"].output("sensitivity.json").read_text())
        ctx.output("report.json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
        ctx.output("report.html").write_text(auto_html(ctx.label, result, sens),
                                             encoding="utf-8")
        ctx.log(f"chose {result['chosen']}: {result['note']}")
        return {"chosen": result["chosen"], "note": result["note"]}

