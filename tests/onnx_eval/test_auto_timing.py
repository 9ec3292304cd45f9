"""The search's timing statistics (``auto.timing.summarise``) on given CPU times: a
candidate timed in two sessions gets the mean of their ratios and a noise at least
their spread, so the session a cold build happens to get cannot make a trial "clearly
faster" than float in one build and not in the next (issue 25, point 1)."""

from __future__ import annotations

from qbuild_onnx.auto.timing import FLOAT, TWIN, summarise, twin_of

ROUNDS = 20


def _times(ms: float) -> list[float]:
    # a small deterministic jitter, the same in every session, so the spread between
    # sessions is only the offset each was given
    return [ms * (1.0 + 0.002 * ((k * 7) % 5 - 2)) for k in range(ROUNDS)]


def test_a_candidate_timed_twice_gets_the_mean_ratio_and_its_sessions_spread():
    cpu = {FLOAT: _times(10.0), TWIN: _times(10.0),
           "a": _times(9.0), twin_of("a"): _times(9.6),   # sessions 6 % apart
           "b": _times(8.0), twin_of("b"): _times(8.0)}   # sessions alike
    doc = summarise(cpu, warmup=1)
    assert set(doc["candidates"]) == {"a", "b"}  # the twins are not candidates
    a, b = doc["candidates"]["a"], doc["candidates"]["b"]
    assert a["sessions"] == [0.9, 0.96] and abs(a["ratio"] - 0.93) < 1e-9
    # 0.93 + 0.06: not clearly 1.05x faster than float (0.952), whichever session
    # a build would have timed alone (0.90 alone would have been)
    assert abs(a["noise"] - 0.06) < 1e-9
    assert b["sessions"] == [0.8, 0.8] and b["noise"] < 0.01


def test_the_baseline_is_the_mean_of_the_float_models_two_sessions():
    cpu = {FLOAT: _times(10.0), TWIN: _times(11.0), "a": _times(9.45),
           twin_of("a"): _times(9.45)}
    doc = summarise(cpu, warmup=1)
    # against the mean of 10 and 11 ms, not the first session's 10 ms
    assert abs(doc["candidates"]["a"]["ratio"] - 0.9) < 1e-9
    assert doc["float_median_ms"] == round(sorted(_times(10.0))[ROUNDS // 2 - 1] / 2
                                           + sorted(_times(10.0))[ROUNDS // 2] / 2, 4)
    # the twin 10 % off: that is every candidate's noise floor
    assert abs(doc["noise_floor"] - 0.1) < 0.01 and doc["candidates"]["a"]["noise"] >= 0.09


def test_a_candidate_without_a_twin_is_summarised_as_before():
    cpu = {FLOAT: _times(10.0), TWIN: _times(10.0), "a": _times(9.0)}
    a = summarise(cpu, warmup=1)["candidates"]["a"]
    assert abs(a["ratio"] - 0.9) < 1e-9 and "sessions" not in a
