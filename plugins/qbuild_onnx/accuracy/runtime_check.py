"""Does a target runtime compute a model as onnxruntime does? The per-target check of
``evaluate`` on a runtime other than onnxruntime.

A runtime can compute a quantized model wrongly: OpenVINO 2026.4 computes a Concat of
two signed-int8 tensors with different scales feeding a convolution (YOLOX's CSP blocks)
so that YOLOX-Nano's detections vanish (F1 0.00 against 0.74 on onnxruntime), while the
same values stored as uint8 are right. Only running the model on the target catches it.
So each candidate is run on the target and on onnxruntime (the reference runtime), both
compared with the float model on onnxruntime, and the candidate is computed *differently*
when the target's result is grossly worse than onnxruntime's:

* some output's SQNR against the float model is ``GROSS_DB`` (10 dB: ten times the
  error power) below onnxruntime's, onnxruntime's counted at most ``CAP_DB`` and at most
  what the runtime itself reaches on the float model in its default precision (a float
  candidate's infinite SQNR, or bf16 arithmetic's loss, is no bar to hold a runtime
  to); or
* the task's agreement with the float model (detection F1, top-1 agreement) is below
  ``TASK_SHARE`` (half) of onnxruntime's.

Rounding differences between two correct runtimes stay far from both: on the models
measured (docs/runtime-targets.md) correct runs were within 5 dB and 0.02 F1 of
onnxruntime, the miscomputed ones 16 to 27 dB below it, or at F1 0. The numbers of
both runtimes and their agreement with each other are reported either way.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

GROSS_DB = 10.0
CAP_DB = 40.0
TASK_SHARE = 0.5
#: task results whose agreement with the float model is checked (both in [0, 1])
TASK_KEYS = ("f1", "top1_agreement")


def _db(value: Any) -> float:
    return float(value)  # reports write infinities as "inf"


def _sqnr_problem(target: Mapping[str, Any], reference: Mapping[str, Any],
                  agreement: Mapping[str, Any], floor: Mapping[str, Any],
                  runtime: str) -> str | None:
    """The first output whose SQNR on the target is grossly below onnxruntime's."""
    for name in sorted(reference):
        ort_db = _db(reference[name]["sqnr_db"])
        got = _db(target[name]["sqnr_db"]) if name in target else -math.inf
        cap = min(CAP_DB, _db(floor[name]["sqnr_db"])) if name in floor else CAP_DB
        if math.isnan(got) or got < min(ort_db, cap) - GROSS_DB:
            both = (f" (the two runtimes agree to {_db(agreement[name]['sqnr_db']):.1f} dB)"
                    if name in agreement else "")
            return (f"output '{name}' SQNR against the float model {got:.1f} dB on "
                    f"{runtime}, {ort_db:.1f} dB on onnxruntime{both}")
    return None


def _task_problem(target: Mapping[str, Any] | None, reference: Mapping[str, Any] | None,
                  runtime: str) -> str | None:
    if not target or not reference:
        return None
    for key in TASK_KEYS:
        if key in target and key in reference:
            got, want = _db(target[key]), _db(reference[key])
            if got < TASK_SHARE * want:
                return f"{key} {got:.2f} on {runtime}, {want:.2f} on onnxruntime"
    return None


def check(runtime: str, target: Mapping[str, Any], reference: Mapping[str, Any],
          agreement: Mapping[str, Any], floor: Mapping[str, Any] | None = None
          ) -> dict[str, Any]:
    """The check's record for one candidate. ``target`` and ``reference`` are its
    ``evaluate`` entries on the target runtime and on onnxruntime (``outputs``: per
    output SQNR against the float model; ``task``: the task result, if any);
    ``agreement`` the per-output comparison of the two runtimes' outputs; ``floor`` the
    float model's own per-output comparison on the target in its default precision.
    ``ok`` is false, with ``reason``, when the target computes the candidate
    differently."""
    problems = [p for p in (_sqnr_problem(target["outputs"], reference["outputs"],
                                          agreement, floor or {}, runtime),
                            _task_problem(target.get("task"), reference.get("task"), runtime))
                if p]
    record: dict[str, Any] = {
        "reference_runtime": "onnxruntime", "ok": not problems,
        "onnxruntime": {"outputs": {k: v["sqnr_db"] for k, v in reference["outputs"].items()}},
        "agreement_sqnr_db": {k: v["sqnr_db"] for k, v in agreement.items()},
    }
    if reference.get("task"):
        record["onnxruntime"]["task"] = {k: v for k, v in reference["task"].items()
                                         if k in (*TASK_KEYS, "score")}
    if problems:
        record["reason"] = (f"{runtime} computes this model differently from onnxruntime: "
                            + "; ".join(problems))
    return record
