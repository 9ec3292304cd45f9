"""Accuracy rules: ``evaluate`` (candidate models vs a reference on a dataset: SQNR, max abs
error, cosine, optional YOLO detection F1 and latency; can fail below a threshold),
``sensitivity`` (per-tensor ranking of a QDQ model), ``mixed_precision`` (precision
overrides for the most sensitive tensors), ``select_best`` (the cheapest of several
evaluated candidates that meets a target) and ``bias_correction`` (a QDQ model with
corrected biases). Thin wrappers over the ``accuracy_*`` modules, which are imported
inside ``run`` only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qbuild import ActionContext, ConfigError, Dep, Rule, attr, dist_version, hookimpl

from .quantize_errors import QuantizeError

# Every rule here needs the "onnx" extra (onnx, onnxruntime, numpy).
ONNX_REQUIRES = ("onnx", "onnxruntime", "numpy")
ONNX_INSTALL = "pip install 'qbuild[onnx]'"


def _env() -> dict[str, str]:
    return {"onnxruntime": dist_version("onnxruntime"), "onnx": dist_version("onnx"),
            "numpy": dist_version("numpy")}


def _onnx_file(ctx: ActionContext, dep: Dep, attr_name: str) -> Path:
    files = [f for f in dep.files if f.suffix == ".onnx"]
    if len(files) != 1:
        raise ctx.fail(f"{dep.label} must have exactly one .onnx output", attr=attr_name)
    return files[0]


def _feeds(ctx: ActionContext, dep: Dep, attr_name: str, limit: int = 0) -> list[dict]:
    """Samples of a qbuild dataset directory (dataset.json + one .npy per input), one feed
    per sample with a batch axis of 1."""
    import json

    import numpy as np

    manifests = [f for f in dep.files if f.name == "dataset.json"]
    if not manifests:
        found = [f / "dataset.json" for f in dep.files if (f / "dataset.json").is_file()]
        manifests = found
    if len(manifests) != 1:
        raise ctx.fail(f"{dep.label} is not a dataset (no dataset.json)", attr=attr_name)
    root = manifests[0].parent
    spec = json.loads(manifests[0].read_text())
    arrays = {name: np.load(root / s["file"], mmap_mode="r")
              for name, s in sorted(spec["inputs"].items())}
    n = int(spec["count"])
    if limit:
        n = min(n, limit)
    return [{k: np.ascontiguousarray(a[i:i + 1]) for k, a in arrays.items()} for i in range(n)]


def _write_json(path: Path, doc: Any) -> None:
    import json

    path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")


def _accuracy_errors():
    from .accuracy_metrics import AccuracyError

    return AccuracyError


class Evaluate(Rule):
    kind = "evaluate"
    requires = ONNX_REQUIRES
    install_hint = ONNX_INSTALL
    machine_dependent = True  # runs the model: results follow the CPU kernels
    version = 2
    heavy = True
    doc = ("Compares candidate models with a reference model on a dataset and writes "
           "report.json: per output SQNR (dB), max abs error and cosine; with task = 'yolo' "
           "also YOLOX detection F1 against the reference's own detections (score >= "
           "score_threshold, same class, IoU >= 0.5); with latency_runs > 0 the 1-thread "
           "latency of every model, timed interleaved in one process after warm-ups "
           "(median, quartiles, spread; noisy runs and models slower than the reference "
           "are flagged; timings make the report not byte-reproducible). Fails if a "
           "candidate in `models` is below min_f1 or min_sqnr_db; `baselines` are reported "
           "the same way but never fail the build.")
    attrs = {
        "models": attr.label_list(doc="Candidate model targets (one .onnx output each).",
                                  required=True),
        "reference": attr.label(doc="The reference (float) model target.", required=True),
        "baselines": attr.label_list(doc="Models reported like `models` (marked gated = "
                                         "false) but exempt from min_f1 and min_sqnr_db."),
        "dataset": attr.label(doc="A dataset target (dataset.json + .npy).", required=True),
        "task": attr.enum(["sqnr", "yolo"], default="sqnr", doc="Extra task metric."),
        "input_size": attr.int(default=416, doc="YOLO square input size."),
        "score_threshold": attr.float(default=0.3, doc="YOLO detection score threshold."),
        "min_f1": attr.float(default=0.0, doc="Fail if a candidate's F1 is below this."),
        "min_sqnr_db": attr.float(default=-1000.0, doc="Fail if an output SQNR is below."),
        "latency_runs": attr.int(default=0, doc="Timed runs per model (0: no latency)."),
    }
    outputs = ["report.json"]

    def is_reproducible(self, attrs: Any) -> bool:
        return not attrs["latency_runs"]  # measured timings differ run to run

    def env(self) -> dict[str, str]:
        return _env()

    def run(self, ctx: ActionContext) -> dict[str, Any]:
        from . import accuracy_yolo as ay
        from .accuracy_metrics import (
            compare_outputs,
            interleaved_latency_ms,
            make_session,
            run_model,
        )

        a = ctx.attrs
        feeds = _feeds(ctx, a["dataset"], "dataset")
        ref_path = _onnx_file(ctx, a["reference"], "reference")
        try:
            ref_sess = make_session(ref_path)
            ref = run_model(ref_sess, feeds)
            report: dict[str, Any] = {"reference": a["reference"].label, "samples": len(feeds),
                                      "models": {}}
            timed = {a["reference"].label: ref_sess}
            failures = []
            gated = {dep.label for dep in a["models"]}
            for dep in [*a["models"], *(a["baselines"] or [])]:
                sess = make_session(_onnx_file(ctx, dep, "models" if dep.label in gated
                                               else "baselines"))
                outs = run_model(sess, feeds)
                entry: dict[str, Any] = {"outputs": compare_outputs(ref, outs)}
                if a["baselines"]:
                    entry["gated"] = dep.label in gated
                if a["task"] == "yolo":
                    name = next(iter(ref[0]))
                    f1 = ay.detection_f1([r[name] for r in ref], [o[name] for o in outs],
                                         a["score_threshold"], size=a["input_size"])
                    f1.pop("per_sample")
                    entry["detection"] = {k: round(v, 6) if isinstance(v, float) else v
                                          for k, v in f1.items()}
                    if f1["f1"] < a["min_f1"] and dep.label in gated:
                        failures.append(f"{dep.label}: F1 {f1['f1']:.4f} < min_f1 {a['min_f1']}")
                for out, m in entry["outputs"].items():
                    s = m["sqnr_db"]
                    s = float("inf") if s == "inf" else float(s)
                    if s < a["min_sqnr_db"] and dep.label in gated:
                        failures.append(f"{dep.label}: output '{out}' SQNR {s:.2f} dB < "
                                        f"min_sqnr_db {a['min_sqnr_db']}")
                timed.setdefault(dep.label, sess)
                report["models"][dep.label] = entry
            if a["latency_runs"]:
                _latency(report, timed, feeds[0], a["latency_runs"], a["reference"].label,
                         interleaved_latency_ms)
                for label in report["latency"]["slower_than_reference"]:
                    ctx.warn(f"{label} is slower than the reference "
                             f"({report['models'][label]['latency_ms']} vs "
                             f"{report['reference_latency_ms']} ms, 1 thread)")
                if report["latency"]["noisy"]:
                    ctx.warn("latency measurement is noisy (interquartile range above 10 % "
                             "of the median for some model): other load on the machine?")
        except _accuracy_errors() as e:
            raise ctx.fail(str(e)) from None
        _write_json(ctx.output("report.json"), report)
        if failures:
            raise ctx.fail("; ".join(failures), attr="min_f1" if "F1" in failures[0]
                           else "min_sqnr_db")
        return {"models": sorted(report["models"])}


def _latency(report: dict, sessions: dict, feed, runs: int, ref: str, measure) -> None:
    """Interleaved 1-thread timings of the reference and every model into ``report``."""
    lat = measure(sessions, feed, runs=runs, warmup=3)
    ref_ms = lat[ref]["median_ms"]
    report["reference_latency_ms"] = ref_ms
    report["latency"] = {"threads": 1, "runs": runs, "warmup": 3, "order": "interleaved",
                         "reference": lat[ref],
                         "noisy": any(v["noisy"] for v in lat.values())}
    slower = []
    for label, entry in report["models"].items():
        m = lat[label]
        entry["latency_ms"] = m["median_ms"]
        entry["latency"] = {**m, "speedup": round(ref_ms / m["median_ms"], 3)
                            if m["median_ms"] else None,
                            "slower_than_reference": m["median_ms"] > ref_ms}
        if m["median_ms"] > ref_ms:
            slower.append(label)
    report["latency"]["slower_than_reference"] = sorted(slower)


class Sensitivity(Rule):
    kind = "sensitivity"
    requires = ONNX_REQUIRES
    install_hint = ONNX_INSTALL
    machine_dependent = True  # runs the model: results follow the CPU kernels
    version = 1
    heavy = True
    doc = ("Ranks the quantization sites (activations and weights) of a QDQ model by their "
           "effect on the output SQNR against the float model, turning sites back to float "
           "by graph surgery (no re-calibration). mode = 'only': one site quantized at a "
           "time; 'leave_out': one site float at a time. Writes sensitivity.json.")
    attrs = {
        "model": attr.label(doc="The QDQ model.", required=True),
        "reference": attr.label(doc="The float model it was quantized from.", required=True),
        "dataset": attr.label(doc="Samples to measure on (usually the calibration set).",
                              required=True),
        "mode": attr.enum(["only", "leave_out"], default="only", doc="Trial kind."),
        "kinds": attr.string_list(default=["activation", "weight"], doc="Site kinds."),
        "max_samples": attr.int(default=8, doc="Use at most this many samples (0: all)."),
    }
    outputs = ["sensitivity.json"]

    def env(self) -> dict[str, str]:
        return _env()

    def validate(self, attrs: Any) -> None:
        bad = sorted(set(attrs["kinds"]) - {"activation", "weight"})
        if bad:
            raise ConfigError(f"unknown site kind(s) {bad} (known: activation, weight)",
                              attr="kinds")

    def run(self, ctx: ActionContext) -> dict[str, Any]:
        from .accuracy_sensitivity import analyze

        a = ctx.attrs
        feeds = _feeds(ctx, a["dataset"], "dataset", a["max_samples"])
        try:
            rep = analyze(_onnx_file(ctx, a["model"], "model"),
                          _onnx_file(ctx, a["reference"], "reference"), feeds,
                          mode=a["mode"], kinds=tuple(a["kinds"]), log=ctx.log)
        except _accuracy_errors() as e:
            raise ctx.fail(str(e)) from None
        _write_json(ctx.output("sensitivity.json"), rep)
        return {"top": [r["site"] for r in rep["ranking"][:10]]}


class MixedPrecision(Rule):
    kind = "mixed_precision"
    requires = ONNX_REQUIRES
    install_hint = ONNX_INSTALL
    version = 2
    heavy = True
    doc = ("Writes overrides.json putting activation tensors at 16 bits or in float: the "
           "named `tensors`, the outputs of `op_types`, and the `top_k` most sensitive "
           "activations of a `sensitivity` report. The document's 'tensors' table is the "
           "quantize rule's tensor_overrides; 'nodes_to_exclude' its nodes_to_exclude; "
           "'promoted' lists the chosen tensors. Use it as quantize's `overrides` label.")
    attrs = {
        "model": attr.label(doc="The float model the overrides refer to.", required=True),
        "sensitivity": attr.label(doc="A sensitivity target (optional)."),
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

    def env(self) -> dict[str, str]:
        return _env()

    def run(self, ctx: ActionContext) -> dict[str, Any]:
        import json

        from .accuracy_mixed_precision import (
            overrides_for_tensors,
            ranked_tensors,
            tensors_by_op_type,
        )

        a = ctx.attrs
        model = _onnx_file(ctx, a["model"], "model")
        try:
            names = _tensor_selection(model, a["tensors"])
            names += tensors_by_op_type(model, a["op_types"])
            if a["sensitivity"] is not None and a["top_k"]:
                rep = json.loads(a["sensitivity"].output("sensitivity.json").read_text())
                names += ranked_tensors(rep)[: a["top_k"]]
            names = list(dict.fromkeys(names))
            doc = overrides_for_tensors(model, names, a["action"])
            doc["promoted"] = names
        except _accuracy_errors() as e:
            raise ctx.fail(str(e)) from None
        except QuantizeError as e:  # a selector that selects nothing, a missing name
            raise ctx.fail(str(e), attr=e.attr) from None
        _write_json(ctx.output("overrides.json"), doc)
        return {"tensors": names, "nodes_to_exclude": doc["nodes_to_exclude"]}


def _tensor_selection(model: Path, entries: list[str]) -> list[str]:
    if not entries:
        return []
    import onnx

    from .selectors import resolve_tensor_list

    return resolve_tensor_list(entries, onnx.load(str(model), load_external_data=False),
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


class SelectBest(Rule):
    kind = "select_best"
    requires = ONNX_REQUIRES
    install_hint = ONNX_INSTALL
    version = 1
    heavy = False
    doc = ("Picks, among candidate models (e.g. quantize variants over mixed_precision "
           "top_k), the cheapest one (fewest promoted tensors, from the quantize info; then "
           "list order) whose score in the `reports` (evaluate targets) meets `threshold`. "
           "Copies it to {name}.onnx and writes report.json; fails if no candidate meets it. "
           "Only this target reruns when the threshold changes.")
    attrs = {
        "models": attr.label_list(doc="Candidate model targets (one .onnx output each).",
                                  required=True),
        "reports": attr.label_list(doc="evaluate targets that report on the candidates.",
                                   required=True),
        "metric": attr.enum(sorted(_HIGHER_IS_BETTER), default="sqnr_db",
                            doc="Score: worst-output SQNR (dB), cosine or max abs error, or "
                                "detection F1 (evaluate task = 'yolo')."),
        "output": attr.string(default="", doc="Score only this model output (default: the "
                              "worst output)."),
        "threshold": attr.float(required=True, doc="Target score: >= (<= for max_abs_error)."),
    }
    outputs = ["{name}.onnx", "report.json"]

    def run(self, ctx: ActionContext) -> dict[str, Any]:
        import json
        import shutil

        a = ctx.attrs
        entries: dict[str, dict[str, Any]] = {}
        for dep in a["reports"]:
            path = dep.output("report.json")
            rep = json.loads(path.read_text())
            if not isinstance(rep, dict) or not isinstance(rep.get("models"), dict):
                raise ctx.fail(f"{dep.label} is not an evaluate report", attr="reports")
            entries.update(rep["models"])
        trials = []
        for index, dep in enumerate(a["models"]):
            if dep.label not in entries:
                raise ctx.fail(f"no report in `reports` evaluates {dep.label}", attr="reports")
            try:
                score = trial_score(entries[dep.label], a["metric"], a["output"])
            except KeyError as e:
                raise ctx.fail(f"{dep.label}: {e.args[0]}", attr="metric") from None
            promoted = dep.info.get("promoted", [])
            trials.append({"model": dep.label, "index": index, "promoted": len(promoted),
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
        src = _onnx_file(ctx, a["models"][chosen["index"]], "models")
        shutil.copyfile(src, ctx.output("{name}.onnx"))
        ctx.log(f"chose {chosen['model']}: {a['metric']} {chosen['score']} with "
                f"{chosen['promoted']} promoted tensor(s)")
        return {"chosen": chosen["model"], "promoted": chosen["tensors"],
                "score": chosen["score"]}


class BiasCorrection(Rule):
    kind = "bias_correction"
    requires = ONNX_REQUIRES
    install_hint = ONNX_INSTALL
    machine_dependent = True  # runs the model: results follow the CPU kernels
    version = 1
    heavy = True
    doc = ("Corrects the Conv/Gemm biases of a QDQ model for the mean output error of weight "
           "quantization measured on a dataset against the float model (empirical bias "
           "correction). Outputs the corrected model and report.json.")
    attrs = {
        "model": attr.label(doc="The QDQ model.", required=True),
        "reference": attr.label(doc="The float model it was quantized from.", required=True),
        "dataset": attr.label(doc="Calibration samples.", required=True),
    }
    outputs = ["{name}.onnx", "report.json"]

    def env(self) -> dict[str, str]:
        return _env()

    def run(self, ctx: ActionContext) -> dict[str, Any]:
        from .accuracy_bias_correction import bias_correct

        a = ctx.attrs
        feeds = _feeds(ctx, a["dataset"], "dataset")
        try:
            _, rep = bias_correct(_onnx_file(ctx, a["model"], "model"),
                                  _onnx_file(ctx, a["reference"], "reference"), feeds,
                                  ctx.output("{name}.onnx"))
        except _accuracy_errors() as e:
            raise ctx.fail(str(e)) from None
        _write_json(ctx.output("report.json"), rep)
        return {"corrected_nodes": rep["corrected_nodes"]}


@hookimpl
def qbuild_rule_types():
    return [Evaluate, Sensitivity, MixedPrecision, BiasCorrection, SelectBest]
