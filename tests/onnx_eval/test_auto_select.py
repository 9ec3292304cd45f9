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
