"""``auto_quantize`` (a macro: its trials are ordinary cached targets, see ``auto_plan``;
the target itself selects, see ``auto_select``), ``sensitive_region`` (the stem or
head region around the most sensitive activation, as quantize overrides) and
``disjoint_dataset`` (a dataset passed on only when it shares nothing with another: the
search's trials read their calibration data through one, so an overlapping selection
set stops the search before anything calibrates). Registered by ``rules.accuracy``'s
hook. Rule API v2: ``sensitive_region`` and ``disjoint_dataset`` are one action each,
``auto_quantize`` four (Trials, Time, Select, Copy: see ``AutoQuantize.analyze``); the
selection names trials and the float model by label (report.json, report.html), so
``analyze`` passes those labels, and the target's own for the page title, as params.
Heavy imports happen inside the actions; the selection's imports none.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from qbuild_onnx_common.providers import DatasetInfo, OnnxModelInfo
from qbuild_onnx_common.rule import OnnxRule
from qbuild_onnx_common.runtimes import check_runtime, key_facts, runtime_attr

from qbuild import AnalysisContext, ConfigError, RuleError, RunContext, attr

from ..accuracy.labelled import check_attrs as check_labelled
from ..accuracy.tasks import check_task_options
from ..providers import EvaluationInfo, OverridesInfo, SensitivityInfo


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


class SensitiveRegion(OnnxRule):
    kind = "sensitive_region"
    version = 2
    heavy = True
    doc = ("Writes overrides.json keeping a whole region float around the `rank`-th most "
           "sensitive activation of a `sensitivity` report: the smaller of the stem "
           "(everything the activation's consumers depend on) and the head (its producer "
           "and everything that depends on it). The region is written as stable "
           "selectors (upto:/after:, docs/selectors.md), never node names. Use it as "
           "quantize's `overrides`.")
    attrs = {
        "model": attr.label(doc="The float model the quantize target quantizes.",
                            required=True, providers=[OnnxModelInfo]),
        "sensitivity": attr.label(doc="A sensitivity target.", required=True,
                                  providers=[SensitivityInfo]),
        "rank": attr.int(default=0, doc="Which ranked activation (0: the most sensitive)."),
        "count": attr.int(default=1, doc="Union of the regions of this many activations "
                          "ranked from `rank` on."),
        "promote_uint16": attr.int(default=0, doc="Also this many of the next ranked "
                                   "activations outside the region at uint16."),
    }
    outputs = ["overrides.json"]
    provides = (OverridesInfo,)

    def analyze(self, ctx: AnalysisContext) -> None:
        ctx.action(sensitive_region, inputs=["model", "sensitivity"],
                   outputs=["overrides.json"], mnemonic="Region",
                   params={k: ctx.attrs[k] for k in ("rank", "count", "promote_uint16")})


def sensitive_region(ctx: RunContext) -> OverridesInfo:
    """``sensitive_region``'s action: write overrides.json."""
    from qbuild_onnx_common.errors import OnnxError

    from ..auto.regions import region_overrides

    a = ctx.params
    model = ctx.inputs["model"][OnnxModelInfo].model
    rep = json.loads(ctx.inputs["sensitivity"][SensitivityInfo].ranking.read_text())
    try:
        doc = region_overrides(model, rep, a["rank"], a["count"], a["promote_uint16"])
    except OnnxError as e:
        raise ctx.fail(e.message, attr="sensitivity") from None
    out = ctx.output("overrides.json")
    out.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    ctx.log(f"region {doc['region']['where']} around {doc['region']['tensor']}: "
            f"{doc['region']['nodes']} node(s) float")
    return OverridesInfo(overrides=out)


class DisjointDataset(OnnxRule):
    kind = "disjoint_dataset"
    version = 1
    heavy = False
    doc = ("A dataset passed on unchanged once it is shown to share no source image (image "
           "datasets) or sample (others) with `disjoint_from`; refused in one line "
           "otherwise. auto_quantize reads its calibration data through one "
           "(<name>.calibration_data, with `search` set), so a selection set that shares "
           "images with it stops the search before any calibration or trial runs.")
    attrs = {
        "dataset": attr.label(doc="The dataset passed on.", required=True,
                              providers=[DatasetInfo]),
        "disjoint_from": attr.label(doc="The dataset it must share nothing with.",
                                    required=True, providers=[DatasetInfo]),
        "search": attr.string(default="", doc="The auto_quantize target (name, same "
                              "package) this check is for: the refusal names it and its "
                              "evaluation_data instead of this target's disjoint_from."),
    }
    outputs = ["data/"]
    provides = (DatasetInfo,)

    def analyze(self, ctx: AnalysisContext) -> None:
        search = ctx.attrs["search"]
        blame = ({"target": f"{ctx.label.rsplit(':', 1)[0]}:{search}",
                  "attr": "evaluation_data", "what": "evaluation_data",
                  "other": "calibration_data"} if search else
                 {"target": None, "attr": "disjoint_from", "what": "disjoint_from",
                  "other": "dataset"})
        ctx.action(disjoint_dataset, inputs=["dataset", "disjoint_from"],
                   outputs=["data/"], mnemonic="CheckSets", params={"blame": blame})


def disjoint_dataset(ctx: RunContext) -> DatasetInfo:
    """``disjoint_dataset``'s action: refuse shared content, else pass the dataset on."""
    import os
    import shutil

    from ..source.splits import shared_content
    from .datasets import dataset_provider

    given = ctx.inputs["dataset"][DatasetInfo]
    what, shared = shared_content(given.path, ctx.inputs["disjoint_from"][DatasetInfo].path)
    if shared:
        b = ctx.params["blame"]
        listed = ", ".join(shared[:3]) + (", ..." if len(shared) > 3 else "")
        message = (f"{b['what']} shares {len(shared)} {what[:-1]}(s) with {b['other']} "
                   f"({listed}): a search judged on its calibration data looks better "
                   "than it is; give disjoint sets (image_dataset's split)")
        raise RuleError(message, target=b["target"], attr=b["attr"])
    out = ctx.output("data/")
    try:  # a staged input is this action's private copy: moving it costs no I/O
        os.rename(given.path, out)
    except OSError:
        shutil.copytree(given.path, out, dirs_exist_ok=True)
    return dataset_provider(out)


class AutoQuantize(OnnxRule):
    kind = "auto_quantize"
    version = 3
    heavy = False
    doc = ("Automatic quantization search, as a macro: expands to calibrate / quantize / "
           "bias_correction / sensitivity / mixed_precision / sensitive_region trials, each "
           "with an evaluate target (named <name>.<trial>, <name>.ev_<trial>), all ordinary "
           "cached targets; this target picks the cheapest trial (objective: measured "
           "latency or size) that meets every `bar` and `max_drop`, or keeps the float "
           "model when none is cheaper; latency differences inside the measured noise "
           "(every candidate timed interleaved in one run) never decide: such ties go to "
           "accuracy, then size, then name. Writes {name}.onnx, report.json and "
           "report.html (and trials.json, latency.json, chosen.json between its four "
           "actions). Changing the bar or objective reruns only the selection, which "
           "reads JSON only (and the copy of the chosen model when the choice changes).")
    attrs = {
        "model": attr.label(doc="The float model (pre-processed).", required=True,
                            providers=[OnnxModelInfo]),
        "calibration_data": attr.label(doc="Dataset to calibrate (and rank sites) on.",
                                       required=True, providers=[DatasetInfo]),
        "evaluation_data": attr.label(doc="Dataset the trials are judged on.", required=True,
                                      providers=[DatasetInfo]),
        "task": attr.string(default="sqnr", doc="Evaluation task (see evaluate)."),
        "task_options": attr.mapping(default={}, doc="Options of the task."),
        "metric_srcs": attr.files(doc="Files of a custom metric."),
        "bar": attr.mapping(default={}, doc="What a trial must meet: min_f1, min_ap50, "
                            "max_top1_drop, min_top1_agreement, min_sqnr_db, min_psnr_db, "
                            "min_score (this and/or max_drop)."),
        "ground_truth": attr.file(doc="Ground truth of the evaluation images (COCO "
                                  "annotations or a labels file, see evaluate): every "
                                  "trial's evaluate scores it."),
        "max_drop": attr.mapping(default={}, doc="Largest absolute drop from the float "
                                 "model on a labelled metric a trial may have, e.g. "
                                 "{ map = 0.01 } or { top1 = 0.005 }; needs ground_truth."),
        "objective": attr.enum(["latency", "size"], default="latency",
                               doc="Cost of a trial: its measured 1-thread latency or its "
                                   "size in bytes."),
        "min_speedup": attr.float(default=1.05, doc="objective latency: the speed-up over "
                                  "float (trial and float timed interleaved in one process) a "
                                  "trial needs, at the slow end of its measured noise, to "
                                  "replace the float model; below it the float model is "
                                  "kept, so no recommended model is slower than float."),
        "latency_runs": attr.int(default=20, doc="Timed runs per trial's evaluate, and "
                                 "rounds of the search's one interleaved timing of every "
                                 "candidate (0: latency is not measured)."),
        "calibration_methods": attr.string_list(default=["minmax", "percentile"],
                                                doc="Calibration methods tried."),
        "percentile": attr.float(default=99.99, doc="The percentile calibration's kept "
                                 "percentage (one calibration, shared by every trial "
                                 "that uses it)."),
        "region_counts": attr.int_list(default=[2, 4, 8, 16], doc="percentile_region: trials "
                                       "keeping float the union of the regions of this "
                                       "many most sensitive activations."),
        "steps": attr.string_list(default=["activation_type", "per_channel", "calibration",
                                           "cle", "bias_correction", "region",
                                           "percentile_region", "float_top_k",
                                           "uint16_top_k", "region_uint16", "lower"],
                                  doc="Which trial families (cle: cross-layer equalization; "
                                      "not in the default: \"adaround\", learned weight "
                                      "rounding, which costs minutes and kept no layer on "
                                      "MobileNetV2, BENCHMARKS.md; \"symmetric\" and "
                                      "\"nncf\", NNCF's preset and recipe, meant for "
                                      "runtimes other than onnxruntime)."),
        "adaround_options": attr.mapping(default={}, doc="Attributes of the adaround trials "
                                         "(rows, iterations, max_samples, ...)."),
        "top_k": attr.int_list(default=[2, 8], doc="Sensitive activations kept float / "
                               "promoted to 16 bits per trial."),
        "sensitivity_samples": attr.int(default=4, doc="Samples the sensitivity uses."),
        "sensitivity_shards": attr.int(default=2, doc="The sensitivity ranking as this "
                                       "many actions (sites split between them, merged by "
                                       "a sensitivity_merge): every core ranks."),
        # one failing trial (or a failing ranking) does not fail the search: it is
        # reported with its reason and left out (auto_select)
        "runtime": runtime_attr("the trials are evaluated and timed on; with openvino "
                                "the trials place Q/DQ at convolution inputs only (what "
                                "OpenVINO fuses) and the integer-operator trials (step "
                                "lower: onnxruntime's operators) are left out"),
        "candidates": attr.label_list(doc="(filled in by the expansion)",
                                      providers=[OnnxModelInfo], tolerate_failures=True),
        "reports": attr.label_list(doc="(filled in by the expansion)",
                                   providers=[EvaluationInfo], tolerate_failures=True),
        "trial_names": attr.string_list(default=[], doc="(filled in by the expansion)"),
        "sensitivity": attr.label(doc="(filled in by the expansion)",
                                  providers=[SensitivityInfo], tolerate_failures=True),
        # not tolerated: a refused selection set fails the search (and, without
        # --keep_going, stops the build before any trial starts)
        "checked_data": attr.label(doc="(filled in by the expansion: the calibration data "
                                   "as the trials read it, <name>.calibration_data, a "
                                   "disjoint_dataset checked against evaluation_data)",
                                   providers=[DatasetInfo]),
    }
    outputs = ["{name}.onnx", "report.json", "report.html", "trials.json", "chosen.json",
               "latency.json"]
    provides = (OnnxModelInfo,)
    machine_dependent = True  # its Time action measures this machine

    @staticmethod
    def expand_targets(name: str, raw: dict[str, Any]
                       ) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
        from ..auto.plan import expand

        return expand(name, raw)

    def target_env(self, attrs: Mapping[str, Any]) -> dict[str, str]:
        return key_facts(attrs["runtime"])

    def validate(self, attrs: Mapping[str, Any]) -> None:
        from ..auto.select import check_bar

        check_runtime(attrs)
        check_task_options(attrs)
        check_labelled(attrs)
        problems = check_bar(attrs["bar"] or {})
        if problems:
            raise ConfigError(problems[0], attr="bar")
        if not attrs["bar"] and not attrs["max_drop"]:
            raise ConfigError("give at least one bar, e.g. bar = { min_sqnr_db = 30 } or "
                              "max_drop = { map = 0.01 }", attr="bar")

    def analyze(self, ctx: AnalysisContext) -> None:
        # Four actions, so that a bar or objective change reruns only JSON work: Trials
        # (what each candidate kept float; no bar in its key), Time (below), Select (the
        # reports against the bar: reads JSON only, stages no model) and Copy (the chosen
        # model; its key is chosen.json, so it is a cache hit when the choice does not
        # change).
        a = ctx.attrs
        labels = {k: a[k] for k in ("model", "candidates")}
        ctx.action(trial_info, inputs=["model", "candidates"], outputs=["trials.json"],
                   mnemonic="Trials", heavy=False,
                   params={"trial_names": a["trial_names"], "labels": labels})
        # Time: every candidate and the float model in one interleaved run, so their
        # ratios share one machine state and each has a measured noise (auto.timing);
        # no bar in its key either
        ctx.action(time_trials, inputs=["model", "candidates", "evaluation_data",
                                        "trials.json"],
                   outputs=["latency.json"], mnemonic="Time", heavy=True,
                   params={"trial_names": a["trial_names"], "rounds": a["latency_runs"],
                           "runtime": a["runtime"]})
        params = {k: a[k] for k in ("trial_names", "bar", "max_drop", "objective",
                                    "min_speedup", "task", "task_options")}
        ctx.action(auto_select, inputs=["reports", "sensitivity", "trials.json",
                                        "latency.json"],
                   outputs=["report.json", "report.html", "chosen.json"], mnemonic="Select",
                   heavy=False, params={**params, "labels": labels, "label": ctx.label})
        ctx.action(copy_chosen, inputs=["model", "candidates", "chosen.json"],
                   outputs=[ctx.output("{name}.onnx")], mnemonic="Copy", heavy=False,
                   params={"trial_names": a["trial_names"],
                           "out": ctx.output("{name}.onnx")})


def trial_info(ctx: RunContext) -> None:
    """``auto_quantize``'s first action: per trial, the nodes it kept float or promoted
    and the joins it kept float (from the candidates' providers)."""
    rows: dict[str, Any] = {}
    for name, dep in zip(ctx.params["trial_names"], ctx.inputs["candidates"], strict=True):
        if dep.failed is not None:
            rows[name] = {"failed": dep.failed}
            continue
        model = dep[OnnxModelInfo]
        rows[name] = {"float_nodes": len(model.promoted),
                      "float_joins": list(model.float_joins)}
    doc = {"trials": rows, "model_outputs": list(ctx.inputs["model"][OnnxModelInfo].outputs)}
    ctx.output("trials.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")


def time_trials(ctx: RunContext) -> None:
    """``auto_quantize``'s timing: the float model (twice per float form the runtime
    offers: the twin measures the noise between two sessions of one model) and every
    candidate that did not fail (twice too: its ratio is its two sessions' mean, its
    noise at least their spread), timed on the search's runtime in one interleaved run on
    the first evaluation sample; latency.json (``auto.timing``). Its progress: the models
    loaded, then the timed runs (every round runs every model), of all there are to do."""
    from qbuild_onnx_common.errors import OnnxError
    from qbuild_onnx_common.runtimes import get
    from qbuild_onnx_common.runtimes.base import DEFAULT, Session

    from ..accuracy.feeds import model_feeds
    from ..auto.timing import float_sessions, summarise, time_candidates, twin_of

    out = ctx.output("latency.json")
    rounds = ctx.params["rounds"]
    trials = json.loads(ctx.inputs["trials.json"].read_text())["trials"]
    doc: dict[str, Any] = {"rounds": 0, "candidates": {}}
    if rounds > 0:
        ref = ctx.inputs["model"][OnnxModelInfo].model
        candidates = {name: dep[OnnxModelInfo].model for name, dep in
                      zip(ctx.params["trial_names"], ctx.inputs["candidates"], strict=True)
                      if "failed" not in trials[name] and dep.failed is None}
        warmup = 3
        try:
            runtime = get(ctx.params["runtime"])
            feed = model_feeds(ctx.inputs["evaluation_data"][DatasetInfo].path, ref, 1)[0]
            forms = runtime.float_forms()
            sessions: dict[str, Session] = {}
            names = [name for form in forms for name in float_sessions(form.name)]
            loads = len(names) + 2 * len(candidates)
            runs = (warmup + rounds) * loads
            for form in forms:
                for name in float_sessions(form.name):
                    sessions[name] = runtime.load(ref, precision=form.precision)
                    ctx.progress(len(sessions), loads + runs)
            for name, path in candidates.items():  # twice: its session-to-session spread
                for session in (name, twin_of(name)):
                    sessions[session] = runtime.load(path, precision=DEFAULT)
                    ctx.progress(len(sessions), loads + runs)
        except OnnxError as e:
            raise ctx.fail(e.message, attr=e.attr or "model") from None
        doc = summarise(time_candidates(sessions, feed, rounds, warmup,
                                        lambda done, _runs: ctx.progress(loads + done,
                                                                         loads + runs)),
                        warmup, [f.name for f in forms])
        doc["runtime"] = {"name": runtime.name, "version": runtime.version(),
                          **runtime.facts()}
        ctx.log(f"timed {len(candidates)} candidate(s) and float interleaved, each twice "
                f"on {runtime.name}, {rounds} rounds: baseline float {doc['baseline']}, "
                f"noise floor {doc['noise_floor']} (float twin)")
    out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")


def auto_select(ctx: RunContext) -> None:
    """``auto_quantize``'s selection: the cheapest trial that meets the bar (or the float
    model); report.json, report.html and chosen.json. Reads JSON only."""
    from ..accuracy.evidence import set_summary
    from ..auto.select import detector_warning, select
    from ..report.html import auto_html

    a, labels, deps = ctx.params, ctx.params["labels"], ctx.inputs
    trial_doc = json.loads(ctx.inputs["trials.json"].read_text())
    trials = trial_doc["trials"]
    reports: list[dict[str, Any] | None] = []
    entries: list[dict[str, Any] | None] = []
    failed: dict[str, str] = {}
    slower: set[str] = set()
    for name, dep, label in zip(a["trial_names"], deps["reports"], labels["candidates"],
                                strict=True):
        # the trial's own failure says more than its evaluation's skip
        why = trials[name].get("failed") or dep.failed
        if why is not None:
            failed[name] = why
            reports.append(None)
            entries.append(None)
            continue
        rep = json.loads(dep[EvaluationInfo].report.read_text())
        reports.append(rep)
        entries.append(rep["models"][label])
        if label in (rep.get("latency") or {}).get("slower_than_reference", ()):
            slower.add(name)
    if len(failed) == len(a["trial_names"]):
        first = next(iter(failed))
        raise ctx.fail(f"every trial failed ({len(failed)}); {first}: {failed[first]}",
                       attr="model")
    timing = json.loads(ctx.inputs["latency.json"].read_text())
    result = select(a["trial_names"], entries, reports, a["bar"], a["objective"],
                    labels["model"], a["min_speedup"], failed,
                    timing if timing.get("rounds") else None, a["max_drop"])
    for row, label in zip(result["trials"], labels["candidates"], strict=True):
        row["model"] = label
        if row["name"] in slower:
            row["slower_than_float"] = True
        if "failed" in trials[row["name"]]:
            continue
        row["float_nodes"] = trials[row["name"]]["float_nodes"]
        if trials[row["name"]]["float_joins"]:
            row["float_joins"] = trials[row["name"]]["float_joins"]
    result.update(_runtime_summary(timing, reports))
    blind = detector_warning(a["bar"], a["task"], a["task_options"],
                             trial_doc["model_outputs"], a["max_drop"])
    if blind:
        result["bar_warning"] = blind
    counts = next((r["evaluation_set"] for r in reports
                   if r is not None and "evaluation_set" in r), None)
    if counts is not None:
        result["selection_set"] = set_summary(counts, a["bar"], "selection")
    result = _clean(result)
    sens = None
    if deps["sensitivity"] is not None and deps["sensitivity"].failed is not None:
        result["sensitivity_failed"] = deps["sensitivity"].failed
    elif deps["sensitivity"] is not None:
        sens = json.loads(deps["sensitivity"][SensitivityInfo].ranking.read_text())
    ctx.output("report.json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    ctx.output("report.html").write_text(auto_html(a["label"], result, sens),
                                         encoding="utf-8")
    ctx.output("chosen.json").write_text(json.dumps({"chosen": result["chosen"]}) + "\n")
    _tell(ctx, result, failed, len(a["trial_names"]), blind)


def _runtime_summary(timing: dict[str, Any], reports: list[dict[str, Any] | None]
                     ) -> dict[str, Any]:
    """What the search ran on: the runtime (name, version, default precision) and, when
    it was timed, the float baseline (the fastest float form) beside every form's
    median."""
    out: dict[str, Any] = {}
    rt = timing.get("runtime") or next((r["runtime"] for r in reports
                                        if r and "runtime" in r), None)
    if rt:
        out["runtime"] = {k: rt[k] for k in ("name", "version", "default_precision")
                          if k in rt}
    if timing.get("baseline"):
        out["float_baseline"] = {"form": timing["baseline"],
                                 "forms_ms": timing.get("float_forms", {})}
    return out


def _tell(ctx: RunContext, result: dict[str, Any], failed: dict[str, str], total: int,
          blind: str | None) -> None:
    """What the search says: each trial's failure in the log, its findings in one console
    line, and a loud warning when most trials failed or the bar cannot see detections."""
    from ..auto.select import findings_line

    ctx.log(f"chose {result['chosen']}: {result['note']}")
    if result["chosen"] == "float":
        # the build succeeds with the model it was given: say why on the console, not
        # only in the report (a search that quantized nothing looks like one that worked)
        ctx.warn(f"kept the float model: {result['note']}")
    for name, why in failed.items():
        ctx.log(f"trial {name} failed and was left out: {why}")
    line = findings_line(result["trials"], total)
    if line:
        ctx.warn(line)
    summary = result.get("failures")
    if summary and summary["most"]:
        reasons = "; ".join(f"{r['count']}x {r['reason']} ({', '.join(r['trials'][:3])}"
                            f"{', ...' if r['count'] > 3 else ''})"
                            for r in summary["reasons"][:3])
        ctx.warn(f"most trials FAILED: {summary['failed']} of {summary['trials']}, so the "
                 f"choice ({result['chosen']}) was made among few: {reasons}")
    if blind:
        ctx.warn(blind)
    if (result.get("selection_set") or {}).get("warning"):
        ctx.warn(result["selection_set"]["warning"])


def copy_chosen(ctx: RunContext) -> OnnxModelInfo:
    """``auto_quantize``'s last action: the chosen model as {name}.onnx (its provider
    from the chosen dependency's: no model is parsed)."""
    import shutil

    chosen = json.loads(ctx.inputs["chosen.json"].read_text())["chosen"]
    deps = ctx.inputs
    if chosen == "float":
        src = deps["model"][OnnxModelInfo]
    else:
        src = deps["candidates"][ctx.params["trial_names"].index(chosen)][OnnxModelInfo]
    out = ctx.output(ctx.params["out"])
    shutil.copyfile(src.model, out)
    return OnnxModelInfo(model=out, opset=src.opset, ir_version=src.ir_version,
                         inputs=src.inputs, outputs=src.outputs)
