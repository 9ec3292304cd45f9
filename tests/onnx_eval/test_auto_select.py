"""auto_quantize's selection: latency compared as a ratio to the float model timed in the
same interleaved run, and a trial replaces float only when clearly faster."""

from __future__ import annotations

from qbuild_onnx.auto.select import select


def _entry(f1: float, ms: float) -> dict:
    return {"outputs": {"y": {"sqnr_db": 30.0}}, "task": {"f1": f1, "score": f1},
            "latency_ms": ms, "latency": {"spread": 0.05, "noisy": False}, "bytes": 100}


def _report(ref_ms: float) -> dict:
    return {"reference_latency_ms": ref_ms, "reference_bytes": 400}


def test_cost_is_the_ratio_to_float_of_the_same_run():
    # trial a ran while the machine was quiet, b under load: b's absolute figure is worse,
    # its ratio to float (timed alongside it) is better
    rep = select(["a", "b"], [_entry(0.96, 8.0), _entry(0.97, 12.0)],
                 [_report(10.0), _report(20.0)], {"min_f1": 0.95}, "latency", "//m:pre", 1.05)
    assert [t["relative_latency"] for t in rep["trials"]] == [0.8, 0.6]
    assert rep["chosen"] == "b" and "1.667x" in rep["note"]


def test_float_is_kept_when_no_passing_trial_is_clearly_faster():
    rep = select(["a", "b"], [_entry(0.90, 5.0), _entry(0.97, 9.8)],
                 [_report(10.0), _report(10.0)], {"min_f1": 0.95}, "latency", "//m:pre", 1.05)
    assert rep["chosen"] == "float"
    assert "faster than float by 1.05x" in rep["note"] and "b at 1.02x" in rep["note"]
    rep = select(["b"], [_entry(0.97, 9.8)], [_report(10.0)], {"min_f1": 0.95}, "latency",
                 "//m:pre", 1.0)
    # 0.98 ± 0.049 (its run's 5 % spread): inside the noise, so float, the most accurate
    assert rep["chosen"] == "float" and "inside the noise" in rep["note"]
    steady = _entry(0.97, 9.8)
    steady["latency"]["spread"] = 0.01
    rep = select(["b"], [steady], [_report(10.0)], {"min_f1": 0.95}, "latency",
                 "//m:pre", 1.0)
    assert rep["chosen"] == "b"
    rep = select(["b"], [_entry(0.97, 10.2)], [_report(10.0)], {"min_f1": 0.95}, "latency",
                 "//m:pre", 1.0)
    assert rep["chosen"] == "float"  # slower than float is never recommended


def test_size_objective_is_unchanged():
    rep = select(["a"], [_entry(0.97, 20.0)], [_report(10.0)], {"min_f1": 0.95}, "size",
                 "//m:pre")
    assert rep["chosen"] == "a"


def test_the_per_round_ratio_is_preferred_when_measured():
    e = _entry(0.97, 8.0)
    e["latency"]["ratio_to_reference"] = 0.9  # the medians alone would say 0.8
    rep = select(["a"], [e], [_report(10.0)], {"min_f1": 0.95}, "latency", "//m:pre", 1.05)
    assert rep["trials"][0]["relative_latency"] == 0.9 and rep["chosen"] == "a"


def test_a_bar_on_the_lower_bound_rejects_a_trial_that_only_just_passes():
    e = _entry(0.95, 7.0)
    e["task"]["f1_lower"] = 0.91
    rep = select(["a"], [e], [_report(10.0)], {"min_f1_lower": 0.95}, "latency", "//m:pre",
                 1.05)
    assert rep["chosen"] == "float" and rep["trials"][0]["misses"] == [
        "min_f1_lower: 0.91 < 0.95"]
    assert rep["float"]["min_f1_lower"] == 1.0


def test_cpu_time_ratio_is_preferred_over_wall_time():
    # under load wall times of one round move with the other processes; the CPU time of the
    # one timing thread does not
    e = _entry(0.97, 8.0)
    e["latency"]["ratio_to_reference"] = 1.02  # wall: a burst of load hit the trial
    e["latency"]["cpu"] = {"ratio_to_reference": 0.7}
    rep = select(["a"], [e], [_report(10.0)], {"min_f1": 0.95}, "latency", "//m:pre", 1.05)
    trial = rep["trials"][0]
    assert trial["relative_latency"] == 0.7 and trial["latency_basis"] == "cpu"
    assert rep["chosen"] == "a"


def test_the_selection_reads_json_only():
    """The selection actions (rerun on every bar change) import no onnx, onnxruntime or
    numpy: what they need is in the evaluate reports and the providers."""
    import subprocess
    import sys

    code = ("import sys; import qbuild_onnx.rules.auto, qbuild_onnx.auto.select, "
            "qbuild_onnx.report.html; "
            "print([m for m in ('onnx', 'onnxruntime', 'numpy') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"


def _timing(**ratios: tuple[float, float]) -> dict:
    """A latency.json: per trial (ratio to float, noise) from one interleaved run."""
    return {"rounds": 20, "basis": "cpu",
            "candidates": {n: {"ratio": r, "noise": h} for n, (r, h) in ratios.items()}}


def test_latency_inside_the_noise_never_decides_accuracy_does():
    # b is 1 % slower than a by the median, well inside both trials' noise: it ties, and
    # b is the more accurate one; the evaluate runs' own ratios are not used
    entries = [_entry(0.96, 8.0), _entry(0.98, 8.1)]
    rep = select(["a", "b"], entries, [_report(10.0)] * 2, {"min_f1": 0.95}, "latency",
                 "//m:pre", 1.05, timing=_timing(a=(0.80, 0.02), b=(0.81, 0.02)))
    assert rep["chosen"] == "b"
    assert rep["latency_choice"] == {"tied": ["b", "a"], "decided_by": "accuracy",
                                     "inside_noise": True}
    assert "inside the timing noise" in rep["note"] and "by accuracy" in rep["note"]
    rows = {t["name"]: t for t in rep["trials"]}
    assert (rows["a"]["relative_latency"], rows["a"]["latency_noise"]) == (0.80, 0.02)
    assert rows["a"]["latency_basis"] == "cpu, one run"
    # the same run with less noise: a is clearly faster, and latency decides
    rep = select(["a", "b"], entries, [_report(10.0)] * 2, {"min_f1": 0.95}, "latency",
                 "//m:pre", 1.05, timing=_timing(a=(0.70, 0.02), b=(0.81, 0.02)))
    assert rep["chosen"] == "a" and rep["latency_choice"]["decided_by"] == "latency"
    assert not rep["latency_choice"]["inside_noise"]
    assert {t["name"]: t["latency_verdict"] for t in rep["trials"]}["b"] == (
        "clearly slower than a")


def test_ties_in_accuracy_go_to_size_then_name():
    small, big = _entry(0.97, 8.0), _entry(0.97, 8.0)
    big["bytes"] = 200
    timing = _timing(x=(0.8, 0.05), y=(0.79, 0.05), z=(0.81, 0.05))
    rep = select(["x", "y", "z"], [big, small, _entry(0.97, 8.0)], [_report(10.0)] * 3,
                 {"min_f1": 0.95}, "latency", "//m:pre", 1.05, timing=timing)
    assert rep["chosen"] == "y" and rep["latency_choice"]["decided_by"] == "name"
    assert rep["latency_choice"]["tied"] == ["y", "z", "x"]  # x is larger: last
    rep = select(["x", "y"], [small, big], [_report(10.0)] * 2, {"min_f1": 0.95},
                 "latency", "//m:pre", 1.05, timing=_timing(x=(0.8, 0.05), y=(0.75, 0.05)))
    assert rep["chosen"] == "x" and rep["latency_choice"]["decided_by"] == "size"


def test_float_wins_a_tie_with_the_speedup_margin():
    # 0.93 ± 0.03 may be slower than 1/1.05 = 0.952: inside the noise, float (the most
    # accurate) is kept; clear of it, the trial replaces float
    rep = select(["a"], [_entry(0.97, 8.0)], [_report(10.0)], {"min_f1": 0.95}, "latency",
                 "//m:pre", 1.05, timing=_timing(a=(0.93, 0.03)))
    assert rep["chosen"] == "float" and "inside the noise" in rep["note"]
    rep = select(["a"], [_entry(0.97, 8.0)], [_report(10.0)], {"min_f1": 0.95}, "latency",
                 "//m:pre", 1.05, timing=_timing(a=(0.90, 0.03)))
    assert rep["chosen"] == "a"


def test_a_task_blind_bar_on_a_detector_warns():
    from qbuild_onnx.auto.select import detector_warning

    bar = {"min_sqnr_db": 30}
    decoded = [{"name": "dets", "shape": [1, 484, 85]}]
    yolov8 = [{"name": "out", "shape": [1, 84, 8400]}]
    logits = [{"name": "prob", "shape": [1, 1000]}]
    assert "output 'dets' is shaped like detections" in detector_warning(bar, "sqnr", {},
                                                                         decoded)
    assert detector_warning(bar, "sqnr", {}, yolov8)
    assert "task = 'detection'" in detector_warning(bar, "detection", {"decoder": "ssd"},
                                                    logits)
    assert "decoder = 'yolox'" in detector_warning(bar, "custom", {"decoder": "yolox"},
                                                   logits)
    assert detector_warning(bar, "sqnr", {}, logits) is None  # a classifier
    # a detection bar beside it: SQNR is not the only judge
    assert detector_warning({**bar, "min_f1": 0.9}, "detection", {}, decoded) is None
    assert detector_warning({"min_f1": 0.9}, "detection", {}, decoded) is None


def test_most_trials_failing_is_said_in_the_note_and_the_summary():
    where = "m/BUILD.toml, target //m:auto.ev_{}: action Evaluate: AssertionError: x"
    names = ["a", "b", "c"]
    rep = select(names, [None, None, _entry(0.97, 8.0)], [None, None, _report(10.0)],
                 {"min_f1": 0.95}, "size", "//m:pre",
                 failed={"a": where.format("a"), "b": where.format("b")})
    assert rep["note"].startswith("2 of 3 trials FAILED")
    assert rep["failures"]["reasons"] == [{"reason": "action Evaluate: AssertionError: x",
                                           "trials": ["a", "b"], "count": 2}]
    rep = select(names, [None, _entry(0.97, 8.0), _entry(0.97, 8.0)],
                 [None, _report(10.0), _report(10.0)], {"min_f1": 0.95}, "size", "//m:pre",
                 failed={"a": where.format("a")})
    assert not rep["failures"]["most"] and "1 trial(s) failed" in rep["note"]
