"""The report pages' one number format (``qbuild_onnx.report.fmt``) and what the pages
show with it (issue 25, point 7): one speed column as a ratio to float with its spread,
sample and detection counts, no exponent anywhere, every warning in the warnings box,
labelled chart points that do not overlap."""

from __future__ import annotations

import re

import pytest
from qbuild_onnx.report import fmt
from qbuild_onnx.report.chart import CHAR_W, place_labels
from qbuild_onnx.report.html import auto_html, evaluate_html, speed, speed_text


@pytest.mark.parametrize(("value", "text"), [
    (0, "0 B"), (900, "900 B"), (999.6, "1.0 KB"), (6800, "6.8 KB"), (68_000, "68 KB"),
    (68_400, "68 KB"), (999_499, "999 KB"), (999_999, "1.0 MB"), (1_234_567, "1.2 MB"),
    (12_345_678, "12 MB"), (3.6e9, "3.6 GB"), (None, "–"), ("inf", "–")])
def test_sizes_are_in_decimal_units(value, text):
    assert fmt.size(value) == text


def test_each_kind_of_number_has_one_format():
    assert fmt.ratio(1.2345) == "1.23×" and fmt.ratio_pm(1.2345, 0.0234) == "1.23× ± 0.02"
    assert fmt.ratio_pm(1.5, None) == "1.50×"
    assert fmt.percent(0.1234) == "12.3 %" and fmt.percent(0.05, 0) == "5 %"
    assert fmt.db(35.71) == "35.7 dB" and fmt.db("inf") == "∞ dB" and fmt.db(-3.26) == "−3.3 dB"
    assert fmt.score(0.96333) == "0.963" and fmt.score(1) == "1.000"
    assert fmt.count(12345) == "12,345" and fmt.count(None) == "–"
    assert fmt.ms(76.66) == "76.7 ms" and fmt.ms(1.234) == "1.23 ms"
    assert fmt.ms(0.0763) == "76.3 µs" and fmt.ms(1234.6) == "1,235 ms"
    assert fmt.plain(0.000123) == "0.000123" and fmt.plain(123456.7) == "123,457"
    assert fmt.plain(9.996) == "10.0" and fmt.plain(42) == "42"


@pytest.mark.parametrize("value", [6.8e4, 1.5e-7, 1e21, 123456789.123, 9.99999e5,
                                   -4.2e-9, 7e15])
def test_no_format_writes_an_exponent(value):
    for f in (fmt.size, fmt.ratio, fmt.percent, fmt.db, fmt.score, fmt.count, fmt.ms,
              fmt.plain):
        text = f(value)
        assert not re.search(r"\de[+-]?\d", text), (f.__name__, value, text)


def test_speed_is_the_inverse_time_ratio_with_the_interval_half_width():
    s, half = speed(0.8, 0.02)
    assert s == pytest.approx(1.25)
    # the interval [1 / 0.82, 1 / 0.78]
    assert half == pytest.approx((1 / 0.78 - 1 / 0.82) / 2)
    assert speed_text(0.8, 0.02) == "1.25× ± 0.03" and speed_text(None) == "–"


def _trial(name, order, rel, noise, **extra):
    return {"name": name, "order": order, "relative_latency": rel, "latency_noise": noise,
            "latency_ms": 120.0, "cpu_ms": 76.7 * rel, "bytes": 68_000, "passes": True,
            "misses": [], "min_f1": 0.97, "worst_sqnr_db": 25.0, "status": "meets the bar",
            "detections": {"reference": 40, "candidate": 39, "matched": 38, "missed": 2,
                           "extra": 1}, **extra}


def _search(**extra):
    return {"objective": "latency", "bar": {"min_f1": 0.95}, "chosen": "b",
            "note": "b meets the bar at 1.45x float's speed; ...", "min_speedup": 1.05,
            "samples": 8, "timing": {"basis": "cpu", "rounds": 20, "noise_floor": 0.05,
                                     "coverage": 0.9, "float_median_ms": 76.7},
            "latency_choice": {"tied": ["b", "a"], "decided_by": "accuracy",
                               "inside_noise": True},
            "float": {"name": "float", "order": -1, "passes": True, "misses": [],
                      "status": "float", "relative_latency": 1.0, "latency_ms": 76.7,
                      "cpu_ms": 76.7, "bytes": 272_000, "min_f1": 1.0,
                      "worst_sqnr_db": "inf",
                      "detections": {"reference": 40, "candidate": 40, "matched": 40,
                                     "missed": 0, "extra": 0}},
            "trials": [_trial("a", 0, 0.70, 0.04), _trial("b", 1, 0.69, 0.04),
                       _trial("c", 2, 1.0, 0.05, status="quantizes nothing",
                              passes=False)],
            **extra}


def _cells(html: str, name: str) -> list[str]:
    row = next(r for r in re.findall(r"<tr[^>]*>(.*?)</tr>", html, re.S)
               if re.search(rf"<td[^>]*>{re.escape(name)}</td>", r))
    return re.findall(r"<td[^>]*>(.*?)</td>", row)


def _headers(html: str) -> list[str]:
    return re.findall(r"<th[^>]*>(.*?)</th>", html)


def test_the_search_page_has_one_speed_column_from_the_timing_run():
    html = auto_html("//m:auto", _search())
    heads = _headers(html)
    assert [h for h in heads if "speed" in h] == ["speed vs float (CPU time, 1 thread)"]
    assert "latency (ms)" not in heads  # the trials' own evaluate runs: not comparable
    b = dict(zip(heads, _cells(html, "b"), strict=True))
    assert b["speed vs float (CPU time, 1 thread)"] == "1.45× ± 0.08"
    assert b["CPU time per run"] == "52.9 ms" and b["size"] == "68 KB"
    # the trial that is the float model runs at float's speed, in the same run
    c = dict(zip(heads, _cells(html, "c"), strict=True))
    assert c["speed vs float (CPU time, 1 thread)"].startswith("1.00× ± 0.05")
    assert c["CPU time per run"] == "76.7 ms"
    f = dict(zip(heads, _cells(html, "float"), strict=True))
    assert f["speed vs float (CPU time, 1 thread)"] == "1.00× (baseline)"
    assert f["size"] == "272 KB" and f["worst SQNR"] == "∞ dB"


def test_the_search_page_counts_samples_and_detections():
    html = auto_html("//m:auto", _search())
    assert "Measured on <b>8</b> sample(s)" in html
    assert "the float model detects <b>40</b> object(s)" in html
    heads = _headers(html)
    b = dict(zip(heads, _cells(html, "b"), strict=True))
    assert (b["detections matched"], b["missed"], b["extra"]) == ("38", "2", "1")
    assert b["F1"] == "0.970"


def test_every_warning_of_a_search_is_in_the_warnings_box():
    html = auto_html("//m:auto", _search(
        bar_warning="the bar min_sqnr_db does not measure detections",
        warnings=["only 8 evaluation samples: F1 moves by 0.1 per missed object",
                  {"message": "calibration set is small"}],
        samples_warning="fewer samples than classes"))
    box = re.search(r'<div class="warnings" id="warnings".*?</div>', html, re.S).group(0)
    assert "Warnings (5)" in box
    for text in ('id="bar-warning"', "does not measure detections", 'id="latency-tie"',
                 "inside the timing noise", "chosen by <b>accuracy</b>",
                 "only 8 evaluation samples", "calibration set is small",
                 "fewer samples than classes"):
        assert text in box, text


def test_no_warnings_no_box():
    result = _search()
    del result["latency_choice"]
    assert 'id="warnings"' not in auto_html("//m:auto", result)


def _evaluation(**extra):
    def model(rel, q1, q3, f1, matched, cand):
        return {"outputs": {"output0": {"sqnr_db": 21.46}}, "bytes": 6.8e4,
                "quantized": "QDQ",
                "task": {"f1": f1, "f1_lower": f1 - 0.1, "ap50": 0.9, "score": f1,
                         "reference_detections": 40, "candidate_detections": cand,
                         "matched": matched},
                "latency_ms": 120.0,
                "latency": {"median_ms": 120.0, "ratio_to_reference": 1.1,
                            "slower_than_reference": rel > 1.0,
                            "cpu": {"median_ms": 76.7 * rel, "ratio_to_reference": rel,
                                    "ratio_q1": q1, "ratio_q3": q3}}}
    return {"reference": "//d:fp", "samples": 2, "task": "detection",
            "reference_bytes": 272_000, "reference_latency_ms": 90.0,
            "latency": {"runs": 10, "noisy": False, "slower_than_reference": ["//d:slow"],
                        "reference": {"median_ms": 90.0, "cpu": {"median_ms": 76.7}}},
            "models": {"//d:q": model(0.8, 0.79, 0.81, 0.96, 38, 39),
                       "//d:slow": model(1.2, 1.18, 1.22, 0.5, 20, 40)}, **extra}


def test_the_evaluate_page_has_one_speed_column_and_no_wall_time_beside_cpu():
    html = evaluate_html(_evaluation())
    heads = _headers(html)
    assert [h for h in heads if "speed" in h or "time" in h] == [
        "speed vs reference (CPU time, 1 thread)", "CPU time per run"]
    q = dict(zip(heads, _cells(html, "//d:q"), strict=True))
    assert q["speed vs reference (CPU time, 1 thread)"] == "1.25× ± 0.02"
    assert q["CPU time per run"] == "61.4 ms" and q["size"] == "68 KB"
    assert q["worst SQNR"] == "21.5 dB" and q["F1"] == "0.960"
    assert (q["detections matched"], q["missed"], q["extra"]) == ("38", "2", "1")
    slow = dict(zip(heads, _cells(html, "//d:slow"), strict=True))
    assert slow["speed vs reference (CPU time, 1 thread)"] == "0.83× ± 0.01 slower"
    ref = dict(zip(heads, _cells(html, "//d:fp"), strict=True))
    assert ref["CPU time per run"] == "76.7 ms" and ref["detections matched"] == "40"
    assert "120" not in "".join(_cells(html, "//d:q"))  # the wall time is not shown
    assert "Measured on <b>2</b> sample(s)" in html
    assert "the reference detects <b>40</b> object(s)" in html
    assert not re.search(r"\de[+-]\d", html)
    box = re.search(r'<div class="warnings".*?</div>', html, re.S).group(0)
    assert "//d:slow</b> is slower than the reference" in box


def test_a_speed_inside_the_spread_says_so():
    rep = _evaluation()
    rep["models"]["//d:q"]["latency"]["cpu"].update(ratio_to_reference=0.99,
                                                    ratio_q1=0.95, ratio_q3=1.04)
    q = dict(zip(_headers(evaluate_html(rep)), _cells(evaluate_html(rep), "//d:q"),
                 strict=True))
    assert q["speed vs reference (CPU time, 1 thread)"] == "1.01× ± 0.05 (inside the noise)"


def test_evaluate_warnings_from_the_report_are_shown():
    html = evaluate_html(_evaluation(warnings=["only 2 samples: too few to judge F1"]))
    assert "only 2 samples: too few to judge F1" in re.search(
        r'<div class="warnings".*?</div>', html, re.S).group(0)


def test_chart_points_are_labelled_with_their_names():
    html = auto_html("//m:auto", _search())
    labels = re.findall(r'<text class="point-label"[^>]*>([^<]*)</text>', html)
    assert sorted(labels) == ["a", "b", "c", "float"]
    assert html.count('<g class="point" aria-label="') == 4
    html = evaluate_html(_evaluation())
    # the package shared by every point is left out of the labels
    assert sorted(re.findall(r'<text class="point-label"[^>]*>([^<]*)</text>', html)) == [
        "q", "slow"]


def test_labels_of_crowded_points_do_not_overlap():
    # twelve points on top of each other and next to each other
    points = [(300.0 + (i % 3) * 4, 200.0 + (i // 3) * 3) for i in range(12)]
    texts = [f"trial_{i}" for i in range(12)]
    spots = place_labels(points, texts)
    assert all(spots), spots
    boxes = []
    for (x, y, anchor), t in zip(spots, texts, strict=True):
        w = len(t) * CHAR_W
        x0 = x if anchor == "start" else x - w if anchor == "end" else x - w / 2
        boxes.append((x0, y - 10, x0 + w, y + 3))
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert not (a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3])


def test_a_set_too_small_to_decide_is_in_the_warnings_box_with_its_counts():
    # the shape accuracy.evidence.set_summary gives evaluate (evaluation_set) and
    # auto_quantize (selection_set)
    summary = {"images": 2, "reference_detections": 5, "text": "2 images, 5 reference "
               "detections", "warning": "the evaluation set is too small to decide: only 5 "
               "reference detections"}
    html = evaluate_html(_evaluation(evaluation_set=summary))
    box = re.search(r'<div class="warnings".*?</div>', html, re.S).group(0)
    assert 'id="set-warning"' in box and "only 5 reference detections" in box
    assert '<p id="evaluation-set">Evaluation set: 2 images, 5 reference detections.</p>' \
        in html
    html = auto_html("//m:auto", _search(selection_set={**summary, "warning": None}))
    assert 'id="set-warning"' not in html and 'id="selection-set"' in html


def test_interleaved_timing_records_the_spread_of_the_ratio():
    # the evaluate page's "± spread": the quartiles of the per-round ratios, from real
    # onnxruntime sessions timed interleaved
    from eval_paths import MODELS, digits
    from qbuild_onnx_common.latency import interleaved_latency_ms
    from qbuild_onnx_common.ort import session

    sessions = {"ref": session(MODELS / "mnist.onnx"), "same": session(MODELS / "mnist.onnx")}
    lat = interleaved_latency_ms(sessions, {"Input3": digits(0, 1)}, runs=5, warmup=1,
                                 reference="ref")
    for timing in (lat["same"], lat["same"]["cpu"]):
        assert timing["ratio_q1"] <= timing["ratio_to_reference"] <= timing["ratio_q3"]
    assert lat["ref"]["cpu"]["ratio_q1"] == lat["ref"]["cpu"]["ratio_q3"] == 1.0


def test_the_selection_gives_the_page_its_counts_and_the_timing_run():
    from qbuild_onnx.auto.select import select

    def entry(f1, matched, cand):
        return {"outputs": {"y": {"sqnr_db": 30.0}}, "bytes": 68_000, "quantized": "QDQ",
                "task": {"f1": f1, "score": f1, "reference_detections": 40,
                         "candidate_detections": cand, "matched": matched},
                "latency_ms": 120.0, "latency": {"spread": 0.05}}

    report = {"samples": 8, "reference_latency_ms": 76.7, "reference_bytes": 272_000}
    timing = {"rounds": 20, "basis": "cpu", "threads": 1, "warmup": 3, "coverage": 0.9,
              "noise_floor": 0.03, "float_median_ms": 50.0,
              "candidates": {"a": {"ratio": 0.7, "noise": 0.03, "median_ms": 35.0},
                             "b": {"ratio": 0.72, "noise": 0.03, "median_ms": 36.0}}}
    result = select(["a", "b"], [entry(0.97, 38, 39), entry(0.96, 37, 40)],
                    [report, report], {"min_f1": 0.95}, "latency", "//m:fp", 1.05,
                    timing=timing)
    assert result["samples"] == 8 and result["timing"]["float_median_ms"] == 50.0
    a = result["trials"][0]
    assert a["cpu_ms"] == 35.0
    assert a["detections"] == {"reference": 40, "candidate": 39, "matched": 38, "missed": 2,
                               "extra": 1}
    assert result["float"]["detections"]["matched"] == 40 and result["float"]["cpu_ms"] == 50.0
    html = auto_html("//m:auto", result)
    rows = dict(zip(_headers(html), _cells(html, "a"), strict=True))
    assert rows["CPU time per run"] == "35.0 ms"  # the timing run's, not the 120 ms
    assert rows["speed vs float (CPU time, 1 thread)"] == "1.43× ± 0.06"
    assert "the float model detects <b>40</b> object(s)" in html
    assert "Measured on <b>8</b> sample(s)" in html and "noise floor ± 0.03" in html


def test_a_point_left_off_the_chart_is_named_with_the_reason():
    result = _search(bar={"min_sqnr_db": 20})
    result["trials"][0]["min_sqnr_db"] = 25.0
    result["trials"][1]["min_sqnr_db"] = 24.0
    result["trials"][2]["min_sqnr_db"] = "inf"
    result["float"]["min_sqnr_db"] = "inf"
    html = auto_html("//m:auto", result)
    assert "not plotted: float (worst SQNR ∞ dB); c (worst SQNR ∞ dB)" in html
    assert sorted(re.findall(r'<text class="point-label"[^>]*>([^<]*)</text>', html)) == [
        "a", "b"]


def test_the_pages_say_which_runtime_ran_and_timed_the_models():
    # evaluate: the runtime's record and a model the target computes differently
    report = _evaluation(runtime={"name": "openvino", "version": "2026.4.1",
                                  "default_precision": "f32", "float_forms": ["fp32"]})
    report["models"]["//d:slow"]["runtime_check"] = {
        "ok": False, "reason": "openvino computes this model differently from onnxruntime"}
    html = evaluate_html(report)
    line = re.search(r'<p id="runtime">(.*?)</p>', html).group(1)
    assert "openvino" in line and "2026.4.1" in line and "f32" in line
    box = html[html.index('id="warnings"'):html.index("</div>")]
    assert "//d:slow" in box and "computes this model differently" in box
    assert "//d:q" not in box.split("runtime-check")[-1]
    # a search: the runtime and the float baseline its speeds are against
    html = auto_html("//m:auto", _search(
        runtime={"name": "openvino", "version": "2026.4.1"},
        float_baseline={"form": "fp32", "forms_ms": {"fp32": 27.1}}))
    line = re.search(r'<p id="runtime">(.*?)</p>', html).group(1)
    assert "openvino" in line and "<b>fp32</b>" in line and "27.1 ms" in line
    # nothing recorded (an older report): no line
    assert 'id="runtime"' not in evaluate_html(_evaluation())
