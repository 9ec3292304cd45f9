"""Accuracy rules: ``evaluate`` (candidate models vs a reference on a dataset: SQNR, max abs
error, cosine, a task's agreement metric, labelled metrics against ground truth and
latency; can fail below a threshold or past a ``max_drop``),
``sensitivity`` (per-tensor ranking of a QDQ model), ``mixed_precision`` (precision
overrides for the most sensitive tensors), ``select_best`` (the cheapest of several
evaluated candidates that meets a target) and ``bias_correction`` (a QDQ model with
corrected biases). Thin wrappers (rule API v2) over the ``accuracy`` modules, which are
imported inside the actions only.

Reports name models by label: ``analyze`` passes the labels of the dependencies as
params (so they are part of the action keys), never the target's own. ``evaluate`` is two
actions: the measurement (report.json, with the evaluation set's counts) and the check of
its bars, which also writes report.html and warns when the set is too small to decide
them (``accuracy.evidence``), so that changing only a bar (min_f1, min_sqnr_db, ...) runs
no model again.
"""

from __future__ import annotations

import filecmp
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qbuild_onnx_common.errors import OnnxError
from qbuild_onnx_common.latency import inside_noise, slower_verdict
from qbuild_onnx_common.models import load_model
from qbuild_onnx_common.providers import (
    DatasetInfo,
    OnnxModelInfo,
    QuantizedModelInfo,
    onnx_model_info,
)
from qbuild_onnx_common.rule import OnnxRule
from qbuild_onnx_common.runtimes import check_runtime, key_facts, runtime_attr

from qbuild import AnalysisContext, ConfigError, Dep, Rule, RunContext, attr, hookimpl

from ..accuracy.labelled import check_attrs as check_labelled
from ..accuracy.tasks import check_task_options
from ..providers import EvaluationInfo, OverridesInfo, SensitivityInfo

if TYPE_CHECKING:
    from qbuild_onnx_common.runtimes.base import Runtime, Session

    from ..accuracy.labelled import LabelledSet
    from ..accuracy.sensitivity import Outputs
    from ..accuracy.tasks import Task


def _model(dep: Dep) -> Path:
    return dep[OnnxModelInfo].model


def _bounded(ctx: RunContext, *attr_names: str) -> None:
    """No model of the dependencies ``attr_names`` (each a label or a list of them) has a
    tensor over the allocation bound: each action here runs them (a refusal names the
    attribute and the model file; the sessions opened later find each file checked)."""
    from qbuild_onnx_common.allocation import AllocationRefused, check_model

    for name in attr_names:
        given = ctx.inputs.get(name)
        for dep in given if isinstance(given, list) else [] if given is None else [given]:
            path = _model(dep)
            try:
                check_model(path)
            except AllocationRefused as e:
                e.file = ctx.workspace_path(path)
                raise e.located(attr=name) from None


def _feeds(ctx: RunContext, dep: Dep, label: str, attr_name: str, model: Path,
           limit: int = 0) -> list[dict[str, Any]]:
    """Samples of a qbuild dataset fed to ``model`` as ``calibrate`` feeds them (arrays one
    rank higher are whole inputs: streaming models; scalar inputs work)."""
    from qbuild_onnx_common.errors import OnnxError

    from ..accuracy.feeds import model_feeds
    from ..source.datasets import InputNamesMismatch
    from .source import blame_dataset

    try:
        return model_feeds(dep[DatasetInfo].path, model, limit)
    except InputNamesMismatch as e:
        raise blame_dataset(ctx, attr_name, e) from None
    except OnnxError as e:
        raise ctx.fail(f"{label}: {e.message}", attr=attr_name) from None


def _params(ctx: AnalysisContext, deps: tuple[str, ...], skip: tuple[str, ...] = ()
            ) -> dict[str, Any]:
    """The target's value attributes (but ``skip``) as params, with ``labels``: the
    labels of the dependencies ``deps`` (what reports and messages name them by)."""
    a = ctx.attrs
    params = {k: v for k, v in a.items() if k not in deps and k not in skip}
    params["labels"] = {k: a[k] for k in deps}
    return params


_TASK_ATTRS = {
    "task": attr.string(default="sqnr", doc="Evaluation task: sqnr, classification, "
                        "detection (task_options.decoder = yolox | yolov8 | ssd | "
                        "fastestdet), yolo (= detection with the yolox decoder), psnr, "
                        "custom (task_options.metric = 'module:function' from metric_srcs), "
                        "or a plugin's qbuild_eval_tasks task."),
    "task_options": attr.mapping(default={}, doc="Options handed to the task (decoder, "
                                 "score_threshold, output, input_size, metric, ...)."),
    "metric_srcs": attr.files(doc="Python files of a custom metric (their code is part of "
                              "the action key)."),
}


_LABELLED_ATTRS = {
    "ground_truth": attr.file(doc="Ground truth of the dataset's images: COCO annotations "
                              "(task detection: mAP@[.5:.95], mAP@.5) or a labels file "
                              "(task classification: top-1, top-5), scored for the "
                              "reference and every model (docs/accuracy-tools.md, "
                              "*Labelled metrics*)."),
    "max_drop": attr.mapping(default={}, doc="Largest absolute drop from the float "
                             "reference allowed on a labelled metric, e.g. { map = 0.01 } "
                             "or { top1 = 0.005 } (map, map50, map75, top1, top5); needs "
                             "ground_truth."),
}


_BUILTIN_TASKS = ("sqnr", "classification", "detection", "yolo", "psnr", "custom")


def _task_code(attrs: Mapping[str, Any]) -> list[str]:
    """A plugin's task is code the action runs: the qbuild_eval_tasks implementers, as
    the engine resolved them, join the key (and are what ``ctx.hooks`` calls)."""
    return [] if attrs.get("task") in _BUILTIN_TASKS else ["hook:qbuild_eval_tasks"]


def _task(ctx: RunContext, extra: dict[str, Any] | None = None
          ) -> tuple[Task, dict[str, Any]]:
    """(task function, options) from the rule's task attributes."""
    from ..accuracy.tasks import get_task

    a = ctx.params
    options = {**(extra or {}), **(a["task_options"] or {})}
    pm = None if a["task"] in _BUILTIN_TASKS else ctx.hooks.pluginmanager
    try:
        return get_task(a["task"], options, ctx.inputs["metric_srcs"] or [], pm), options
    except OnnxError as e:
        raise ctx.fail(e.message, attr=e.attr or "task") from None


def _write_json(path: Path, doc: Any) -> None:
    import json

    path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")


class Evaluate(OnnxRule):
    kind = "evaluate"
    machine_dependent = True  # runs the model: results follow the CPU kernels
    version = 4
    heavy = True
    def code(self, attrs: Mapping[str, Any]) -> list[str]:
        return [*super().code(attrs), *_task_code(attrs)]

    doc = ("Compares candidate models with a reference model on a dataset and writes "
           "report.json and report.html: per output SQNR (dB), max abs error and cosine, and "
           "the `task` result (classification agreement, detection F1/AP50 against the "
           "reference's own detections, PSNR, a custom metric...); with `ground_truth` "
           "the labelled metrics (COCO mAP, or top-1/top-5 against labels) of the reference "
           "and every model; with latency_runs > 0 the "
           "1-thread latency of every model, timed interleaved in one process after warm-ups "
           "(median, quartiles, spread; noisy runs and models slower than the reference are "
           "flagged; timings make the report not byte-reproducible). Fails if a candidate in "
           "`models` misses a bar (min_f1, min_sqnr_db, max_top1_drop, min_psnr_db, "
           "min_score, max_drop); `baselines` are reported but never fail the build.")
    attrs = {
        "models": attr.label_list(doc="Candidate model targets.", required=True,
                                  providers=[OnnxModelInfo]),
        "reference": attr.label(doc="The reference (float) model target.", required=True,
                                providers=[OnnxModelInfo]),
        "baselines": attr.label_list(doc="Models reported like `models` (marked gated = "
                                         "false) but exempt from the bars.",
                                     providers=[OnnxModelInfo]),
        "dataset": attr.label(doc="A dataset target.", required=True,
                              providers=[DatasetInfo]),
        **_TASK_ATTRS,
        "input_size": attr.int(default=416, doc="YOLOX square input size (task 'yolo')."),
        "score_threshold": attr.float(default=0.3, doc="Detection score threshold."),
        "min_f1": attr.float(default=0.0, doc="Fail if a candidate's F1 is below this."),
        "min_sqnr_db": attr.float(default=-1000.0, doc="Fail if an output SQNR is below."),
        "max_top1_drop": attr.float(default=1.0, doc="Fail if 1 - top-1 agreement is above."),
        "min_psnr_db": attr.float(default=-1000.0, doc="Fail if the PSNR is below."),
        "min_score": attr.float(default=-1e30, doc="Fail if the task score is below."),
        **_LABELLED_ATTRS,
        "latency_runs": attr.int(default=0, doc="Timed runs per model (0: no latency)."),
        "latency_warnings": attr.bool(default=True, doc="Warn when a model is slower than "
                                      "the reference or the timing is noisy (an "
                                      "auto_quantize search turns it off: its report "
                                      "gathers its trials' findings)."),
        "runtime": runtime_attr("runs and times the models (the float model's outputs "
                                "always come from onnxruntime; on openvino every model "
                                "is also run on onnxruntime, and a gated model that "
                                "openvino computes grossly differently fails)"),
        "set_warnings": attr.bool(default=True, doc="Warn when the dataset is too small "
                                  "to decide: too few reference detections or "
                                  "predictions, distinct images or classes, or too few "
                                  "for a bar's resolution (an auto_quantize search turns "
                                  "it off for its trials and warns once itself)."),
    }
    outputs = ["report.json", "report.html"]
    provides = (EvaluationInfo,)

    def is_reproducible(self, attrs: Mapping[str, Any]) -> bool:
        return not attrs["latency_runs"]  # measured timings differ run to run

    def target_env(self, attrs: Mapping[str, Any]) -> dict[str, str]:
        return key_facts(attrs["runtime"])

    def validate(self, attrs: Mapping[str, Any]) -> None:
        check_runtime(attrs)
        check_task_options(attrs)
        check_labelled(attrs)

    def analyze(self, ctx: AnalysisContext) -> None:
        deps = ("models", "reference", "baselines", "dataset")
        params = _params(ctx, deps, ("metric_srcs", "ground_truth", "set_warnings", *_BARS))
        ctx.action(evaluate, inputs=[*deps, "metric_srcs", "ground_truth"],
                   outputs=["report.json"], params=params, mnemonic="Evaluate")
        ctx.action(check_bars, inputs=["report.json"], outputs=["report.html"],
                   mnemonic="CheckBars", heavy=False,
                   params={"task": ctx.attrs["task"], "gated": ctx.attrs["models"],
                           "set_warnings": ctx.attrs["set_warnings"],
                           **{k: ctx.attrs[k] for k in _BARS}})


_BARS = ("min_f1", "min_sqnr_db", "max_top1_drop", "min_psnr_db", "min_score", "max_drop")


def evaluate(ctx: RunContext) -> EvaluationInfo:
    """``evaluate``'s first action: run every model, write report.json."""
    from qbuild_onnx_common.ort import session
    from qbuild_onnx_common.runtimes import ONNXRUNTIME, get

    from ..accuracy.evidence import set_counts
    from ..accuracy.metrics import compare_outputs, run_model

    a, labels, deps = ctx.params, ctx.params["labels"], ctx.inputs
    _bounded(ctx, "reference", "models", "baselines")
    ref_path = _model(deps["reference"])
    feeds = _feeds(ctx, deps["dataset"], labels["dataset"], "dataset", ref_path)
    task, options = _task(ctx, {"input_size": a["input_size"],
                                "score_threshold": a["score_threshold"]})
    truth = _ground_truth(ctx, options)
    if truth is not None and options.get("category_ids") and "num_classes" not in options:
        # declared ids name every model class: layout auto may count on them (the
        # annotations' own categories may not be the model's classes)
        options = {**options, "num_classes": len(truth.category_ids)}
    try:
        runtime = get(a["runtime"])
        # the float model's outputs always come from onnxruntime: the same reference
        # whatever the runtime, so reports on two runtimes compare
        ref_sess = session(ref_path)
        ref = run_model(ref_sess, feeds)
        report: dict[str, Any] = {"reference": labels["reference"], "samples": len(feeds),
                                  "task": a["task"], "models": {}}
        if truth is not None:
            report["reference_labelled"] = _labelled(ctx, truth, ref, options, None)
        report["evaluation_set"] = set_counts(a["task"], options, ref,
                                              deps["dataset"][DatasetInfo].path)
        report["reference_bytes"] = ref_path.stat().st_size
        timed = _float_forms(report, runtime, ref_path, labels["reference"], ref_sess)
        floats = list(timed)
        if runtime.name != ONNXRUNTIME:  # the float model's own outputs on the target
            report["runtime"]["float_outputs"] = {
                form: compare_outputs(ref, run_model(timed[name], feeds))
                for form, name in zip(report["runtime"]["float_forms"], floats, strict=True)}
        gated = set(labels["models"])
        timed_order = [*labels["models"], *(labels["baselines"] or [])]
        for dep, label in zip([*deps["models"], *(deps["baselines"] or [])],
                              timed_order, strict=True):
            path = _model(dep)
            sess = runtime.load(path, what=label)
            outs = run_model(sess, feeds)
            entry = _entry(outs, ref, path, task, options, a["task"])
            if filecmp.cmp(path, ref_path, shallow=False):
                # the reference itself (a search that kept float): any difference in time
                # is noise, never "slower than the reference"
                entry["same_as_reference"] = True
            if labels["baselines"]:
                entry["gated"] = label in gated
            if truth is not None:
                entry["labelled"] = _labelled(ctx, truth, outs, options,
                                              report["reference_labelled"])
            if runtime.name != ONNXRUNTIME:
                floor = report["runtime"]["float_outputs"][report["runtime"]["float_forms"][-1]]
                _check_runtime(entry, runtime.name, outs, run_model(session(path), feeds),
                               ref, floor, task, options, a["task"])
            timed.setdefault(label, sess)
            report["models"][label] = entry
            ctx.progress(len(report["models"]), len(timed_order))
        if a["latency_runs"]:
            _latency(report, timed, feeds[0], a["latency_runs"], floats)
            _latency_warnings(ctx, report, a["latency_warnings"])
    except OnnxError as e:
        raise ctx.fail(e.message, attr=e.attr) from None
    _write_json(ctx.output("report.json"), report)
    return EvaluationInfo(report=ctx.output("report.json"))


def _ground_truth(ctx: RunContext, options: Mapping[str, Any]) -> LabelledSet | None:
    """The labelled samples of the dataset, when ``ground_truth`` is given; an error
    in the file names it (as the user knows it) and the attribute."""
    from ..accuracy.labelled import prepare

    path = ctx.inputs["ground_truth"]
    if path is None:
        return None
    try:
        return prepare(ctx.params["task"], path, ctx.inputs["dataset"][DatasetInfo].path,
                       options)
    except OnnxError as e:
        if e.file is not None:
            e.file = ctx.workspace_path(e.file)
        raise e.located(attr="ground_truth") from None


def _labelled(ctx: RunContext, truth: LabelledSet, outputs: list[dict[str, Any]],
              options: Mapping[str, Any], reference: dict[str, Any] | None
              ) -> dict[str, Any]:
    """One model's labelled metrics (with its drop from ``reference``'s, if given)."""
    from ..accuracy.labelled import drops, measure
    from ..accuracy.metrics import json_float

    try:
        found = measure(truth, outputs, options, reference=reference is None)
    except OnnxError as e:
        raise ctx.fail(e.message, attr=e.attr or "ground_truth") from None
    found = {k: json_float(v) if isinstance(v, float) else v for k, v in found.items()}
    if reference is not None:
        found["drop"] = drops(reference, found)
    return found


def _float_forms(report: dict[str, Any], runtime: Runtime, ref_path: Path, label: str,
                 ref_sess: Session) -> dict[str, Session]:
    """The float model's sessions on ``runtime``, one per float form (fp32 first, named
    by the reference's label; another form as "<label> [bf16]"), and the runtime's
    record in ``report``. On onnxruntime: its one fp32 session, the reference's."""
    from qbuild_onnx_common.runtimes import ONNXRUNTIME

    forms = runtime.float_forms()
    report["runtime"] = {"name": runtime.name, "version": runtime.version(),
                         **runtime.facts(), "float_forms": [f.name for f in forms]}
    if runtime.name == ONNXRUNTIME:
        return {label: ref_sess}
    return {(label if k == 0 else f"{label} [{f.name}]"):
            runtime.load(ref_path, precision=f.precision, what=label)
            for k, f in enumerate(forms)}


def _entry(outs: list[dict[str, Any]], ref: list[dict[str, Any]], path: Path,
           task: Task, options: dict[str, Any], task_name: str) -> dict[str, Any]:
    """One model's report entry from its outputs: per-output comparison with the
    reference, size, form and the task's result."""
    from ..accuracy.metrics import compare_outputs
    from ..accuracy.tasks import run_task

    entry: dict[str, Any] = {"outputs": compare_outputs(ref, outs),
                             "bytes": path.stat().st_size, "quantized": _quantized(path)}
    if task_name != "sqnr":
        entry["task"] = run_task(task, ref, outs, options)
        if "f1" in entry["task"]:
            entry["detection"] = entry["task"]  # select_best's metric = "f1"
    return entry


def _check_runtime(entry: dict[str, Any], runtime: str, outs: list[dict[str, Any]],
                   ort_outs: list[dict[str, Any]], ref: list[dict[str, Any]],
                   floor: dict[str, Any], task: Task, options: dict[str, Any],
                   task_name: str) -> None:
    """The per-target check (``accuracy.runtime_check``) of one model into its entry:
    the same model on onnxruntime (``ort_outs``), compared with the float model and with
    the target's outputs (``outs``); ``floor``: the float model on the target."""
    from ..accuracy.metrics import compare_outputs
    from ..accuracy.runtime_check import check
    from ..accuracy.tasks import run_task

    on_ort: dict[str, Any] = {"outputs": compare_outputs(ref, ort_outs)}
    if task_name != "sqnr":
        on_ort["task"] = run_task(task, ref, ort_outs, options)
    agreement = compare_outputs(ort_outs, outs)
    entry["runtime_check"] = check(runtime, entry, on_ort, agreement, floor)


def slower_line(report: Mapping[str, Any]) -> str | None:
    """One console line for every model an evaluation found slower than the reference
    beyond the timing noise (the models in the report's rows), or None."""
    parts = []
    basis = "cpu"
    for label in report["latency"]["slower_than_reference"]:
        v = slower_verdict(report["models"][label]["latency"], report["latency"]["reference"])
        basis = v["basis"]
        parts.append(f"{label} ({v['ms']} vs {v['reference_ms']} ms)")
    if not parts:
        return None
    return (f"{', '.join(parts)} {'is' if len(parts) == 1 else 'are'} slower than the "
            f"reference beyond the timing noise ({'CPU' if basis == 'cpu' else 'wall'} "
            "time, median, 1 thread)")


def _latency_warnings(ctx: RunContext, report: dict[str, Any], warn: bool) -> None:
    if not warn:
        return
    line = slower_line(report)
    if line:
        ctx.warn(line)
    if report["latency"]["noisy"]:
        ctx.warn("latency measurement is noisy (interquartile range above 10 % "
                 "of the median for some model): other load on the machine?")


def _quantized(path: Path) -> str | None:
    """How the model is quantized ('QDQ', 'QOperator', 'dynamic'), or None for a float
    model (a trial that kept everything float is the float model, not a candidate)."""

    from ..source.model_checks import quantized_form

    form = quantized_form(load_model(path, external_data=False))
    return form[0] if form else None


def _count_bars(a: Mapping[str, Any]) -> dict[str, float]:
    """The bars of an evaluate target that count decisions (those it sets), by the
    names ``auto_quantize`` uses: min_score is F1 for detection, top-1 agreement for
    classification."""
    bars = {}
    if a["min_f1"] > 0:
        bars["min_f1"] = a["min_f1"]
    if a["max_top1_drop"] < 1:
        bars["max_top1_drop"] = a["max_top1_drop"]
    if a["min_score"] > 0 and a["task"] in ("detection", "yolo", "classification"):
        key = "min_top1_agreement" if a["task"] == "classification" else "min_f1"
        bars[key] = max(bars.get(key, 0.0), a["min_score"])
    return bars


def check_bars(ctx: RunContext) -> None:
    """``evaluate``'s second action: report.html, with a warning (also on the console)
    when the set is too small to decide the bars; fail if a gated model misses a bar, or
    if the runtime computes it grossly differently from onnxruntime (``runtime_check``)."""
    import json

    from ..accuracy.evidence import set_summary
    from ..report.html import evaluate_html

    report = json.loads(ctx.inputs["report.json"].read_text())
    if "evaluation_set" in report:
        report["evaluation_set"] = set_summary(report["evaluation_set"],
                                               _count_bars(ctx.params), "evaluation")
        warning = report["evaluation_set"].get("warning")
        if warning and ctx.params["set_warnings"]:
            ctx.warn(warning)
    ctx.output("report.html").write_text(evaluate_html(report), encoding="utf-8")
    failures: list[tuple[str, str]] = []
    for label in ctx.params["gated"]:
        entry = report["models"][label]
        check = entry.get("runtime_check")
        if check is not None and not check["ok"]:
            failures.append(("runtime", f"{label}: {check['reason']}"))
        failures += [(m, f"{label}: {m}")
                     for m in [*_bar_failures(ctx.params, entry),
                               *_drop_failures(ctx.params["max_drop"], entry)]]
    if failures:
        raise ctx.fail("; ".join(f for _, f in failures), attr=failures[0][0].split(":")[0])


def _latency(report: dict[str, Any], sessions: Mapping[str, Session],
             feed: Mapping[str, Any], runs: int, floats: Sequence[str]) -> None:
    """Interleaved 1-thread timings of the float model and every model into ``report``.
    ``floats`` names the float model's sessions, one per float form the runtime offers
    (fp32 first): the fastest is the baseline every speed-up is against, and with more
    than one form each is reported (``float_forms``)."""
    from qbuild_onnx_common.latency import summaries
    from qbuild_onnx_common.runtimes.timing import fastest, interleaved

    times = interleaved(sessions, feed, runs, warmup=3)
    ref = fastest(times, list(floats))
    lat = summaries(times, reference=ref)
    ref_ms = lat[ref]["median_ms"]
    report["reference_latency_ms"] = ref_ms
    report["latency"] = {"threads": 1, "runs": runs, "warmup": 3, "order": "interleaved",
                         "reference": lat[ref],
                         "noisy": any(v["noisy"] for v in lat.values())}
    forms = (report.get("runtime") or {}).get("float_forms") or ["fp32"]
    if len(floats) > 1:
        report["latency"]["float_forms"] = {form: lat[name] for form, name
                                            in zip(forms, floats, strict=True)}
    report["latency"]["baseline"] = forms[list(floats).index(ref)]
    slower = []
    for label, entry in report["models"].items():
        m = lat[label]
        # one thread: slower or not is decided on CPU time (steady under load), not wall;
        # a median a little above the reference's inside the rounds' spread is not slower
        # (the float model itself measures so half the time)
        v = slower_verdict(m, lat[ref])
        v["slower"] = v["slower"] and not inside_noise(m["cpu"] if v["basis"] == "cpu" else m)
        if entry.get("same_as_reference"):
            v["slower"] = False
        entry["latency_ms"] = m["median_ms"]
        entry["latency"] = {**m, "speedup": round(ref_ms / m["median_ms"], 3)
                            if m["median_ms"] else None,
                            "slower_than_reference": v["slower"], "slower_basis": v["basis"]}
        if v["slower"]:
            slower.append(label)
    report["latency"]["slower_than_reference"] = sorted(slower)


def _bar_failures(a: dict[str, Any], entry: dict[str, Any]) -> list[str]:
    """The bars an evaluated entry misses, each as 'attr_name: detail'."""
    out = []
    for name, m in entry["outputs"].items():
        s = m["sqnr_db"]
        s = float("inf") if s == "inf" else float(s)
        if s < a["min_sqnr_db"]:
            out.append(f"min_sqnr_db: output '{name}' SQNR {s:.2f} dB < {a['min_sqnr_db']}")
    t = entry.get("task", {})
    checks = [("min_f1", "f1", True), ("max_top1_drop", "top1_drop", False),
              ("min_score", "score", True)]
    if a["task"] == "psnr":
        checks.append(("min_psnr_db", "score", True))
    for bar, key, higher in checks:
        if key not in t:
            continue
        v = float(t[key]) if t[key] not in ("inf", "-inf", "nan") else float(t[key])
        if (v < a[bar]) if higher else (v > a[bar]):
            what = "F1" if key == "f1" else key
            out.append(f"{bar}: {what} {v:.4f} {'<' if higher else '>'} {a[bar]}")
    return out


def _drop_failures(max_drop: Mapping[str, float], entry: dict[str, Any]) -> list[str]:
    """The ``max_drop`` bars an entry misses, each as 'max_drop: detail'."""
    out = []
    found = entry.get("labelled") or {}
    for key, limit in max_drop.items():
        drop = (found.get("drop") or {}).get(key)
        if drop is None:
            out.append(f"max_drop: {key} was not measured")
        elif drop > limit:
            out.append(f"max_drop: {key} drops by {drop:.4f} from the float model "
                       f"(to {found[key]}) > {limit}")
    return out


class Sensitivity(OnnxRule):
    kind = "sensitivity"
    machine_dependent = True  # runs the model: results follow the CPU kernels
    version = 2
    heavy = True
    def code(self, attrs: Mapping[str, Any]) -> list[str]:
        return [*super().code(attrs), *_task_code(attrs)]

    doc = ("Ranks the quantization sites (activations and weights) of a QDQ model by their "
           "effect on the output SQNR against the float model, turning sites back to float "
           "by graph surgery (no re-calibration). mode = 'only': one site quantized at a "
           "time; 'leave_out': one site float at a time. With a `task` (e.g. detection) sites "
           "are scored by the task's score instead of the worst output SQNR, so the sites "
           "that break the task rank first. Writes sensitivity.json.")
    attrs = {
        "model": attr.label(doc="The QDQ model.", required=True, providers=[OnnxModelInfo]),
        "reference": attr.label(doc="The float model it was quantized from.", required=True,
                                providers=[OnnxModelInfo]),
        "dataset": attr.label(doc="Samples to measure on (usually the calibration set).",
                              required=True, providers=[DatasetInfo]),
        "mode": attr.enum(["only", "leave_out"], default="only", doc="Trial kind."),
        "kinds": attr.string_list(default=["activation", "weight"], doc="Site kinds."),
        "max_samples": attr.int(default=8, doc="Use at most this many samples (0: all)."),
        "shards": attr.int(default=1, doc="Rank only every `shards`-th site (from `shard` "
                           "on); `sensitivity_merge` joins the shards, so several actions "
                           "(cores) rank one model."),
        "shard": attr.int(default=0, doc="Which shard (0 <= shard < shards)."),
        **_TASK_ATTRS,
    }
    outputs = ["sensitivity.json"]
    provides = (SensitivityInfo,)

    def validate(self, attrs: Mapping[str, Any]) -> None:
        bad = sorted(set(attrs["kinds"]) - {"activation", "weight"})
        if bad:
            raise ConfigError(f"unknown site kind(s) {bad} (known: activation, weight)",
                              attr="kinds")
        if attrs["shards"] < 1:
            raise ConfigError("must be at least 1", attr="shards")
        if not 0 <= attrs["shard"] < attrs["shards"]:
            raise ConfigError(f"must be in 0..{attrs['shards'] - 1}", attr="shard")
        check_task_options(attrs)

    def analyze(self, ctx: AnalysisContext) -> None:
        deps = ("model", "reference", "dataset")
        ctx.action(sensitivity, inputs=[*deps, "metric_srcs"], outputs=["sensitivity.json"],
                   params=_params(ctx, deps, ("metric_srcs",)), mnemonic="Sensitivity")


def sensitivity(ctx: RunContext) -> SensitivityInfo:
    """``sensitivity``'s action: rank the sites, write sensitivity.json."""
    from ..accuracy.sensitivity import analyze

    a, deps = ctx.params, ctx.inputs
    _bounded(ctx, "reference", "model")
    ref_path = _model(deps["reference"])
    feeds = _feeds(ctx, deps["dataset"], a["labels"]["dataset"], "dataset", ref_path,
                   a["max_samples"])
    metric: Callable[[Outputs, Outputs], float] | None = None
    if a["task"] != "sqnr":
        from ..accuracy.tasks import run_task, score_of

        task, options = _task(ctx)

        def task_score(ref: Outputs, outs: Outputs) -> float:
            return score_of(run_task(task, ref, outs, options))

        metric = task_score
    try:
        rep = analyze(_model(deps["model"]), ref_path, feeds,
                      mode=a["mode"], kinds=tuple(a["kinds"]), metric=metric, log=ctx.log,
                      shard=a["shard"], shards=a["shards"], progress=ctx.progress)
        rep["task"] = a["task"]
    except OnnxError as e:
        raise ctx.fail(e.message, attr=e.attr) from None
    _write_json(ctx.output("sensitivity.json"), rep)
    return SensitivityInfo(ranking=ctx.output("sensitivity.json"))


class SensitivityMerge(OnnxRule):
    kind = "sensitivity_merge"
    version = 1
    heavy = False
    doc = ("Joins the shards of one sensitivity ranking (sensitivity targets with the same "
           "model, reference, dataset and options and shard = 0 .. shards - 1) into one "
           "sensitivity.json, ranked as one run would rank it.")
    attrs = {
        "shards": attr.label_list(doc="The sensitivity shard targets.", required=True,
                                  providers=[SensitivityInfo]),
    }
    outputs = ["sensitivity.json"]
    provides = (SensitivityInfo,)

    def analyze(self, ctx: AnalysisContext) -> None:
        ctx.action(sensitivity_merge, inputs=["shards"], outputs=["sensitivity.json"],
                   mnemonic="MergeSensitivity")


def sensitivity_merge(ctx: RunContext) -> SensitivityInfo:
    """``sensitivity_merge``'s action: one ranking from its shards (JSON only)."""
    import json

    from ..accuracy.ranking import merge

    reports = [json.loads(d[SensitivityInfo].ranking.read_text())
               for d in ctx.inputs["shards"]]
    try:
        rep = merge(reports)
    except OnnxError as e:
        raise ctx.fail(e.message, attr="shards") from None
    _write_json(ctx.output("sensitivity.json"), rep)
    return SensitivityInfo(ranking=ctx.output("sensitivity.json"))


class MixedPrecision(OnnxRule):
    kind = "mixed_precision"
    version = 2
    heavy = True
    doc = ("Writes overrides.json putting activation tensors at 16 bits or in float: the "
           "named `tensors`, the outputs of `op_types`, and the `top_k` most sensitive "
           "activations of a `sensitivity` report. The document's 'tensors' table is the "
           "quantize rule's tensor_overrides; 'nodes_to_exclude' its nodes_to_exclude; "
           "'promoted' lists the chosen tensors. Use it as quantize's `overrides` label.")
    attrs = {
        "model": attr.label(doc="The float model the overrides refer to.", required=True,
                            providers=[OnnxModelInfo]),
        "sensitivity": attr.label(doc="A sensitivity target (optional).",
                                  providers=[SensitivityInfo]),
        "top_k": attr.int(default=0, doc="How many ranked activations to promote."),
        "tensors": attr.string_list(default=[], doc="Tensors promoted: names or stable "
                                    "selectors ('op:TYPE', 'upto:TENSOR', globs; "
                                    "docs/selectors.md)."),
        "op_types": attr.string_list(default=[], doc="Promote outputs of these op types."),
        "action": attr.enum(["uint16", "int16", "float"], default="uint16",
                            doc="16-bit activations, or keep float (excludes producer and "
                                "consumers from quantization)."),
    }
    outputs = ["overrides.json"]
    provides = (OverridesInfo,)

    def analyze(self, ctx: AnalysisContext) -> None:
        deps = ("model", "sensitivity")
        ctx.action(mixed_precision, inputs=list(deps), outputs=["overrides.json"],
                   params=_params(ctx, deps), mnemonic="MixedPrecision")


def mixed_precision(ctx: RunContext) -> OverridesInfo:
    """``mixed_precision``'s action: write overrides.json."""
    import json

    from ..accuracy.mixed_precision import (
        overrides_for_tensors,
        ranked_tensors,
        tensors_by_op_type,
    )

    a, deps = ctx.params, ctx.inputs
    model = _model(deps["model"])
    try:
        names = _tensor_selection(model, a["tensors"])
        names += tensors_by_op_type(model, a["op_types"])
        if deps["sensitivity"] is not None and a["top_k"]:
            rep = json.loads(deps["sensitivity"][SensitivityInfo].ranking.read_text())
            names += ranked_tensors(rep)[: a["top_k"]]
        names = list(dict.fromkeys(names))
        doc = overrides_for_tensors(model, names, a["action"])
        doc["promoted"] = names
    except OnnxError as e:  # a selector that selects nothing, a missing name
        raise ctx.fail(e.message, attr=e.attr) from None
    _write_json(ctx.output("overrides.json"), doc)
    return OverridesInfo(overrides=ctx.output("overrides.json"))


def _tensor_selection(model: Path, entries: list[str]) -> list[str]:
    if not entries:
        return []

    from ..quantization.selectors import resolve_tensor_list

    return resolve_tensor_list(entries, load_model(model, external_data=False),
                               "tensors")


_HIGHER_IS_BETTER = {"sqnr_db": True, "cosine": True, "f1": True, "max_abs_error": False}


def trial_score(entry: dict[str, Any], metric: str, output: str = "") -> float:
    """One model's score in an evaluate report entry: detection F1, or the worst output's
    SQNR / cosine / max abs error (or the named output's)."""
    if metric == "f1":
        if "detection" not in entry:
            raise KeyError("the report has no detection F1 (evaluate with task = 'yolo')")
        return float(entry["detection"]["f1"])
    outs = entry["outputs"]
    if output:
        if output not in outs:
            raise KeyError(f"no output '{output}' in the report (it has: {', '.join(outs)})")
        outs = {output: outs[output]}
    values = [float("inf") if m[metric] == "inf" else float(m[metric]) for m in outs.values()]
    return min(values) if _HIGHER_IS_BETTER[metric] else max(values)


def select(trials: list[dict[str, Any]], metric: str, threshold: float) -> dict[str, Any] | None:
    """The cheapest trial (fewest promoted tensors, then list order) whose score meets
    ``threshold`` (>= for higher-is-better metrics, <= for max_abs_error), or None."""
    higher = _HIGHER_IS_BETTER[metric]
    ok = [t for t in trials if (t["score"] >= threshold if higher else t["score"] <= threshold)]
    return min(ok, key=lambda t: (t["promoted"], t["index"])) if ok else None


class SelectBest(OnnxRule):
    kind = "select_best"
    version = 1
    heavy = False
    doc = ("Picks, among candidate models (e.g. quantize variants over mixed_precision "
           "top_k), the cheapest one (fewest promoted tensors, as each model's OnnxModelInfo "
           "says; then list order) whose score in the `reports` (evaluate targets) meets "
           "`threshold`. Copies it to {name}.onnx and writes report.json; fails if no "
           "candidate meets it. Only this target reruns when the threshold changes.")
    attrs = {
        "models": attr.label_list(doc="Candidate model targets.", required=True,
                                  providers=[OnnxModelInfo]),
        "reports": attr.label_list(doc="evaluate targets that report on the candidates.",
                                   required=True, providers=[EvaluationInfo]),
        "metric": attr.enum(sorted(_HIGHER_IS_BETTER), default="sqnr_db",
                            doc="Score: worst-output SQNR (dB), cosine or max abs error, or "
                                "detection F1 (evaluate task = 'yolo')."),
        "output": attr.string(default="", doc="Score only this model output (default: the "
                              "worst output)."),
        "threshold": attr.float(required=True, doc="Target score: >= (<= for max_abs_error)."),
    }
    outputs = ["{name}.onnx", "report.json"]
    provides = (OnnxModelInfo,)

    def analyze(self, ctx: AnalysisContext) -> None:
        deps = ("models", "reports")
        ctx.action(select_best, inputs=list(deps), outputs=ctx.outputs, mnemonic="Select",
                   params={**_params(ctx, deps), "out": ctx.output("{name}.onnx")})


def select_best(ctx: RunContext) -> OnnxModelInfo:
    """``select_best``'s action: score the candidates, copy the chosen one."""
    import json
    import shutil

    a, labels, deps = ctx.params, ctx.params["labels"], ctx.inputs
    entries: dict[str, dict[str, Any]] = {}
    for dep, label in zip(deps["reports"], labels["reports"], strict=True):
        rep = json.loads(dep[EvaluationInfo].report.read_text())
        if not isinstance(rep, dict) or not isinstance(rep.get("models"), dict):
            raise ctx.fail(f"{label} is not an evaluate report", attr="reports")
        entries.update(rep["models"])
    trials = []
    for index, (dep, label) in enumerate(zip(deps["models"], labels["models"], strict=True)):
        if label not in entries:
            raise ctx.fail(f"no report in `reports` evaluates {label}", attr="reports")
        try:
            score = trial_score(entries[label], a["metric"], a["output"])
        except KeyError as e:
            raise ctx.fail(f"{label}: {e.args[0]}", attr="metric") from None
        promoted = dep[OnnxModelInfo].promoted
        trials.append({"model": label, "index": index, "promoted": len(promoted),
                       "tensors": list(promoted), "score": round(score, 6)})
    chosen = select(trials, a["metric"], a["threshold"])
    report = {"metric": a["metric"], "output": a["output"], "threshold": a["threshold"],
              "chosen": chosen["model"] if chosen else None,
              "trials": [{k: v for k, v in t.items() if k != "index"} for t in trials]}
    _write_json(ctx.output("report.json"), report)
    if chosen is None:
        best = max(trials, key=lambda t: t["score"] if _HIGHER_IS_BETTER[a["metric"]]
                   else -t["score"])
        raise ctx.fail(f"no candidate meets {a['metric']} "
                       f"{'>=' if _HIGHER_IS_BETTER[a['metric']] else '<='} "
                       f"{a['threshold']}; best is {best['model']} with {best['score']} "
                       f"({len(trials)} candidates)", attr="threshold")
    out = ctx.output(a["out"])
    source = deps["models"][chosen["index"]][OnnxModelInfo]
    shutil.copyfile(source.model, out)
    ctx.log(f"chose {chosen['model']}: {a['metric']} {chosen['score']} with "
            f"{chosen['promoted']} promoted tensor(s)")
    return onnx_model_info(out, promoted=source.promoted, float_joins=source.float_joins)


class BiasCorrection(OnnxRule):
    kind = "bias_correction"
    machine_dependent = True  # runs the model: results follow the CPU kernels
    version = 2
    heavy = True
    doc = ("Corrects the Conv/Gemm biases of a QDQ model for the mean output error measured "
           "on a dataset against the float model (empirical bias correction): of weight "
           "quantization (method 'weights') or of the whole quantized layer, its input's "
           "Q/DQ included (method 'fast', NNCF's FastBiasCorrection). One streaming pass of "
           "the float model. Outputs the corrected model and report.json.")
    attrs = {
        "model": attr.label(doc="The QDQ model.", required=True, providers=[OnnxModelInfo]),
        "reference": attr.label(doc="The float model it was quantized from.", required=True,
                                providers=[OnnxModelInfo]),
        "dataset": attr.label(doc="Calibration samples.", required=True,
                              providers=[DatasetInfo]),
        "method": attr.enum(["weights", "fast"], default="weights", doc="What error each "
                            "layer's bias absorbs: 'weights' (weight quantization) or 'fast' "
                            "(NNCF's FastBiasCorrection: weight and input quantization, each "
                            "layer against float inputs; docs/accuracy-tools.md)."),
    }
    outputs = ["{name}.onnx", "report.json"]
    provides = (OnnxModelInfo,)

    def analyze(self, ctx: AnalysisContext) -> None:
        deps = ("model", "reference", "dataset")
        ctx.action(bias_correction, inputs=list(deps), outputs=ctx.outputs,
                   params={**_params(ctx, deps), "out": ctx.output("{name}.onnx")},
                   mnemonic="BiasCorrection")


def bias_correction(ctx: RunContext) -> OnnxModelInfo:
    """``bias_correction``'s action: the corrected model and report.json."""
    from ..accuracy.bias_correction import bias_correct

    deps = ctx.inputs
    _bounded(ctx, "reference", "model")
    ref_path = _model(deps["reference"])
    feeds = _feeds(ctx, deps["dataset"], ctx.params["labels"]["dataset"], "dataset", ref_path)
    out = ctx.output(ctx.params["out"])
    try:
        _, rep = bias_correct(_model(deps["model"]), ref_path, feeds, out,
                              from_quantizer=QuantizedModelInfo in deps["model"],
                              method=ctx.params["method"])
    except OnnxError as e:
        raise ctx.fail(e.message, attr=e.attr) from None
    _write_json(ctx.output("report.json"), rep)
    # The corrected model keeps its source's precision choices: pass them on, so that
    # select_best does not count a bias-corrected trial as having no promoted tensors.
    given = deps["model"][OnnxModelInfo]
    return onnx_model_info(out, promoted=given.promoted, float_joins=given.float_joins)


@hookimpl
def qbuild_rule_types() -> list[type[Rule]]:
    from .auto import AutoQuantize, DisjointDataset, SensitiveRegion

    return [Evaluate, Sensitivity, SensitivityMerge, MixedPrecision, BiasCorrection,
            SelectBest, AutoQuantize, SensitiveRegion, DisjointDataset]
