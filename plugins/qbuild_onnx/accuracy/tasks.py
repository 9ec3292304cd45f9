"""Evaluation tasks: how a candidate model's outputs are scored against the reference
model's on the same samples.

A task is ``task(ref_outputs, cand_outputs, options) -> dict``: the two lists hold one
``{output name: array}`` per sample, ``options`` is the rule's ``task_options`` table. The
result must hold ``score`` (one number, higher is better: what bars and sensitivity
rankings use) and may hold anything JSON-ready besides. Built-in tasks:

* ``sqnr``: per-output SQNR; score = the worst output's.
* ``classification``: top-1 / top-5 agreement of the candidate with the reference's
  predicted class (argmax over the last axis of ``output``, default the first output);
  score = top-1 agreement; ``top1_drop`` = 1 − top-1 agreement.
* ``detection`` (alias ``yolo`` = decoder ``yolox``): F1 / AP50 against the reference's
  detections, with the decoders of ``detection``; score = F1.
* ``psnr``: per-output PSNR with the peak = the reference's value range; score = worst.
* ``custom``: ``options["metric"] = "module:function"``, the function taking the same
  arguments as a task (the rule loads it from its ``metric_srcs`` files so that its code is
  part of the action key).

Plugins add tasks through the ``qbuild_eval_tasks`` hook (see ``hookspecs``).
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qbuild_onnx_common.errors import OnnxError, exception_reason

from qbuild import ConfigError

from .metrics import ErrorAccumulator, json_float

if TYPE_CHECKING:
    import pluggy
    from qbuild_onnx_common.arrays import Float64Array

Samples = Sequence[Mapping[str, Any]]  # one {output name: array} per sample
Task = Callable[[Samples, Samples, Mapping[str, Any]], dict[str, Any]]


def _check(ref: Samples, cand: Samples) -> None:
    if len(ref) != len(cand):
        raise OnnxError(f"sample count mismatch: reference {len(ref)} vs candidate "
                            f"{len(cand)}")


def task_sqnr(ref: Samples, cand: Samples, options: Mapping[str, Any]) -> dict[str, Any]:
    _check(ref, cand)
    acc: dict[str, ErrorAccumulator] = {}
    for r, c in zip(ref, cand):
        for k in sorted(r):
            acc.setdefault(k, ErrorAccumulator()).add(r[k], c[k], f"output '{k}'")
    per = {k: a.sqnr_db() for k, a in sorted(acc.items())}
    return {"score": min(per.values()), "per_output_sqnr_db":
            {k: json_float(v) for k, v in per.items()}}


def logits(sample: Mapping[str, Any], output: str) -> Float64Array:
    """One sample's scores of ``output`` (default the first output) as rows × classes."""
    import numpy as np

    if output and output not in sample:
        raise OnnxError(f"classification: no output '{output}' (outputs: "
                            f"{', '.join(sample)})")
    a = np.asarray(sample[output] if output else next(iter(sample.values())), np.float64)
    return a.reshape(-1, a.shape[-1]) if a.ndim else a.reshape(1, 1)


def task_classification(ref: Samples, cand: Samples, options: Mapping[str, Any]
                        ) -> dict[str, Any]:
    import numpy as np

    _check(ref, cand)
    output = options.get("output", "")
    top1 = top5 = n = 0
    for r, c in zip(ref, cand):
        lr, lc = logits(r, output), logits(c, output)
        want = lr.argmax(axis=1)
        k = min(5, lc.shape[1])
        best = np.argsort(-lc, axis=1, kind="stable")[:, :k]
        top1 += int((best[:, 0] == want).sum())
        top5 += int((best == want[:, None]).any(axis=1).sum())
        n += len(want)
    a1 = top1 / n if n else 1.0
    return {"score": a1, "top1_agreement": a1, "top5_agreement": top5 / n if n else 1.0,
            "top1_drop": 1.0 - a1, "predictions": n}


def task_detection(ref: Samples, cand: Samples, options: Mapping[str, Any]
                   ) -> dict[str, Any]:
    from .detection import detection_metrics

    _check(ref, cand)
    return detection_metrics(ref, cand, options)


def task_yolo(ref: Samples, cand: Samples, options: Mapping[str, Any]) -> dict[str, Any]:
    return task_detection(ref, cand, {**options, "decoder": "yolox"})


def task_psnr(ref: Samples, cand: Samples, options: Mapping[str, Any]) -> dict[str, Any]:
    import numpy as np

    _check(ref, cand)
    lo: dict[str, float] = {}
    hi: dict[str, float] = {}
    err: dict[str, float] = {}
    cnt: dict[str, int] = {}
    for r, c in zip(ref, cand):
        for k in sorted(r):
            a, b = np.asarray(r[k], np.float64), np.asarray(c[k], np.float64)
            if a.shape != b.shape:
                raise OnnxError(f"output '{k}': shape mismatch {a.shape} vs {b.shape}")
            lo[k] = min(lo.get(k, math.inf), float(a.min()) if a.size else math.inf)
            hi[k] = max(hi.get(k, -math.inf), float(a.max()) if a.size else -math.inf)
            err[k] = err.get(k, 0.0) + float(((a - b) ** 2).sum())
            cnt[k] = cnt.get(k, 0) + a.size
    peak = options.get("peak")
    per = {}
    for k in sorted(err):
        p = float(peak) if peak else max(hi[k] - lo[k], 1e-12)
        mse = err[k] / max(cnt[k], 1)
        per[k] = math.inf if mse == 0 else 10.0 * math.log10(p * p / mse)
    return {"score": min(per.values()), "per_output_psnr_db":
            {k: json_float(v) for k, v in per.items()}}


BUILTIN_TASKS: dict[str, Task] = {
    "sqnr": task_sqnr,
    "classification": task_classification,
    "detection": task_detection,
    "yolo": task_yolo,
    "psnr": task_psnr,
}

# What a bar attribute means: (task result key, True if the value must be >= the bar).
BAR_KEYS: dict[str, tuple[str, bool]] = {
    "min_f1": ("f1", True),
    "min_f1_lower": ("f1_lower", True),  # detection.f1_lower_bound: 90 % lower bound
    "min_ap50": ("ap50", True),
    "max_top1_drop": ("top1_drop", False),
    "min_top1_agreement": ("top1_agreement", True),
    "min_sqnr_db": ("score", True),
    "min_psnr_db": ("score", True),
    "min_score": ("score", True),
}


def available_tasks(pm: pluggy.PluginManager | None = None) -> dict[str, Task]:
    """Built-in tasks and those of every plugin's ``qbuild_eval_tasks`` hook. Without
    ``pm`` a plugin manager is built from the entry points (rules run in workers)."""
    import pluggy

    from .. import hookspecs

    if pm is None:
        pm = pluggy.PluginManager("qbuild")
        pm.add_hookspecs(hookspecs)
        pm.load_setuptools_entrypoints("qbuild")
    elif not hasattr(pm.hook, "qbuild_eval_tasks"):
        pm.add_hookspecs(hookspecs)
    found: dict[str, Task] = dict(BUILTIN_TASKS)
    for result in pm.hook.qbuild_eval_tasks():
        for name, fn in (result or {}).items():
            if name in found and found[name] is not fn:
                raise OnnxError(f"evaluation task '{name}' is provided twice")
            found[name] = fn
    return found


def load_custom_metric(reference: str, srcs: Sequence[Path]) -> Task:
    """``module:function`` loaded from the file ``module.py`` among ``srcs`` (the rule's
    declared sources, so the metric's code is in the action key)."""
    mod, _, fn = reference.partition(":")
    if not mod or not fn:
        raise OnnxError(f"custom metric '{reference}' must be 'module:function'")
    path = next((Path(p) for p in srcs if Path(p).name == mod.rpartition(".")[2] + ".py"),
                None)
    if path is None:
        raise OnnxError(f"custom metric '{reference}': list {mod.rpartition('.')[2]}.py "
                            "in metric_srcs (its code is then part of the action key)")
    spec = importlib.util.spec_from_file_location(f"qbuild_metric_{path.stem}", path)
    # a .py path always has a spec and a loader
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # the user's code: any error is a bad input
        raise OnnxError(f"custom metric '{reference}': {path.name} fails to import: "
                            f"{type(e).__name__}: {e}") from None
    func = getattr(module, fn, None)
    if not callable(func):
        raise OnnxError(f"custom metric '{reference}': {path.name} has no function '{fn}'")
    task: Task = func
    return task


# The built-in tasks' options and the type each must have: ``task_options`` is a free
# table (plugins' tasks take their own options), so the known ones are checked here,
# at analysis, rather than read with a silent conversion (``0`` read as false) later.
OPTION_TYPES: dict[str, str] = {
    "background_class": "bool", "decoder": "string", "output": "string",
    "boxes_output": "string", "scores_output": "string", "metric": "string",
    "input_size": "int", "strides": "int list", "score_threshold": "number",
    "nms_threshold": "number", "iou_threshold": "number", "peak": "number",
    "layout": "string", "num_classes": "int", "box_units": "string",
    "map_score_threshold": "number", "category_ids": "ids",
}
# options whose value is one of a few words
OPTION_VALUES: dict[str, tuple[str, ...]] = {
    "layout": ("raw", "auto", "xywh_obj_cls", "xyxy_obj_cls", "xywh_cls", "xyxy_cls"),
    "box_units": ("pixels", "normalized"),
}


def _has_type(value: Any, kind: str) -> bool:
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "string":
        return isinstance(value, str)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "ids":
        return value == "coco80" or _has_type(value, "int list")
    return isinstance(value, list) and all(_has_type(v, "int") for v in value)


_TYPE_WORDS = {"bool": "true or false", "string": "a string", "int": "an integer",
               "number": "a number", "int list": "a list of integers",
               "ids": 'a list of integers (one category id per class) or "coco80"'}


def option_problem(options: Mapping[str, Any]) -> str | None:
    """The first built-in task option of the wrong type, as one sentence (None: all
    fine): ``background_class = 0`` is refused, not read as false."""
    for key, kind in OPTION_TYPES.items():
        if key in options and not _has_type(options[key], kind):
            value = options[key]
            hint = (f" (write {'true' if value else 'false'})"
                    if kind == "bool" and isinstance(value, int) else "")
            return (f"task_options.{key}: expected {_TYPE_WORDS[kind]}, got "
                    f"{value!r}{hint}")
    for key, allowed in OPTION_VALUES.items():
        if key in options and options[key] not in allowed:
            return (f"task_options.{key}: '{options[key]}' is not one of "
                    f"{', '.join(allowed)}")
    return None


def check_task_options(attrs: Mapping[str, Any]) -> None:
    """Refuse a built-in task option of the wrong type (an analysis error naming
    ``task_options``)."""
    problem = option_problem(attrs.get("task_options") or {})
    if problem:
        raise ConfigError(problem, attr="task_options")


def get_task(name: str, options: Mapping[str, Any], srcs: Sequence[Path] = (),
             pm: pluggy.PluginManager | None = None) -> Task:
    """The task called ``name`` (``custom`` resolves ``options['metric']``)."""
    if name == "custom":
        return load_custom_metric(str(options.get("metric", "")), srcs)
    tasks = BUILTIN_TASKS if name in BUILTIN_TASKS else available_tasks(pm)
    if name not in tasks:
        raise OnnxError(f"unknown evaluation task '{name}' (known: "
                            f"{', '.join(sorted([*tasks, 'custom']))})")
    return tasks[name]


def run_task(task: Task, ref: Samples, cand: Samples, options: Mapping[str, Any]
             ) -> dict[str, Any]:
    """Run a task and check its result has a numeric ``score``; floats are rounded. A
    task that fails without a message (a bare ``assert``) is reported with where it
    failed, so the reason reaches the reports."""
    try:
        result = task(ref, cand, options)
    except Exception as e:
        if str(e).strip():
            raise
        raise OnnxError(f"the evaluation task failed: {exception_reason(e)}") from e
    if not isinstance(result, dict) or not isinstance(result.get("score"), (int, float)):
        raise OnnxError("an evaluation task must return a dict with a numeric 'score'")
    return {k: json_float(v) if isinstance(v, float) else v for k, v in result.items()}


def score_of(result: Mapping[str, Any], key: str = "score") -> float:
    v = result[key]
    return math.inf if v == "inf" else -math.inf if v == "-inf" else float(v)
