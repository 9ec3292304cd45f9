"""What needs no runtime: the placement preset each runtime gives auto_quantize's trials,
the rule of the per-target check on the numbers evaluate reports, and the lock that
makes CI install OpenVINO (so the tests that need it run there)."""

from __future__ import annotations

import pytest
from qbuild_onnx.accuracy.runtime_check import check
from qbuild_onnx.auto.plan import expand
from rt_models import ROOT

from qbuild import ConfigError

RAW = {"model": ":fp", "calibration_data": ":c", "evaluation_data": ":e",
       "bar": {"min_sqnr_db": 20}, "steps": ["activation_type", "cle", "region", "lower"]}


def _quantize_tables(runtime: str | None) -> dict[str, dict]:
    raw = dict(RAW, **({"runtime": runtime} if runtime else {}))
    tables, own = expand("aq", raw)
    return {name: t for name, t in tables.items() if t["rule"] == "quantize"}, tables, own


def test_openvino_trials_quantize_convolution_inputs_only():
    ort, ort_all, ort_own = _quantize_tables(None)
    ov, ov_all, ov_own = _quantize_tables("openvino")
    assert set(ov) == set(ort)  # the same trials...
    for name, table in ort.items():  # ...onnxruntime's with its quantizer's own placement
        assert "op_types" not in table and "placement" not in table, name
    for name, table in ov.items():  # ...OpenVINO's with Q/DQ where convolutions read
        if "placement" in table:
            assert table["placement"] == "conv_inputs"
        else:
            assert table["op_types"] == ["Conv", "MatMul", "Gemm"]
            assert table["extra_options"] == {
                "OpTypesToExcludeOutputQuantization": ["Conv", "MatMul", "Gemm"]}
        assert {k: v for k, v in table.items() if k not in ("op_types", "extra_options",
                                                              "placement")} == ort[name]
    # lowered trials run onnxruntime's integer operators: not on OpenVINO
    assert any(t["rule"] == "lower_integer" for t in ort_all.values())
    assert not any(t["rule"] == "lower_integer" for t in ov_all.values())
    # every trial is evaluated (and the search timed) on the search's runtime
    evals = [t for t in ov_all.values() if t["rule"] == "evaluate"]
    assert evals and all(t["runtime"] == "openvino" for t in evals)
    assert all(t["runtime"] == "onnxruntime" for t in ort_all.values()
               if t["rule"] == "evaluate")


def test_an_unknown_runtime_names_the_attribute():
    with pytest.raises(ConfigError) as e:
        expand("aq", dict(RAW, runtime="tensorrt"))
    assert e.value.attr == "runtime" and "onnxruntime, openvino" in str(e.value)


def _entry(sqnr: float | str, **task: float) -> dict:
    e: dict = {"outputs": {"y": {"sqnr_db": sqnr}}}
    if task:
        e["task"] = dict(task)
    return e


def test_the_check_fails_a_gross_difference_and_passes_rounding():
    # figures as measured (docs/runtime-targets.md): a CSP block in int8 on OpenVINO
    bad = check("openvino", _entry(7.9), _entry(35.1), {"y": {"sqnr_db": 8.0}})
    assert not bad["ok"]
    assert bad["reason"] == ("openvino computes this model differently from onnxruntime: "
                             "output 'y' SQNR against the float model 7.9 dB on openvino, "
                             "35.1 dB on onnxruntime (the two runtimes agree to 8.0 dB)")
    # MobileNetV2 uint8: 4.5 dB apart on a good model is rounding, not a wrong model
    assert check("openvino", _entry(42.6), _entry(47.1), {"y": {"sqnr_db": 44.6}})["ok"]
    # a float candidate: onnxruntime's infinite SQNR is capped, bf16's ~40 dB is fine
    assert check("openvino", _entry(35.0), _entry("inf"), {"y": {"sqnr_db": 35.0}})["ok"]
    assert not check("openvino", _entry(25.0), _entry("inf"), {"y": {"sqnr_db": 25}})["ok"]
    # ...unless the runtime's own float precision reaches no more (bf16 on a BF16 CPU):
    # the float model on the target at its default precision is the floor
    assert check("openvino", _entry(25.0), _entry("inf"), {"y": {"sqnr_db": 25}},
                 {"y": {"sqnr_db": 27.0}})["ok"]
    assert not check("openvino", _entry(12.0), _entry("inf"), {"y": {"sqnr_db": 12}},
                     {"y": {"sqnr_db": 27.0}})["ok"]
    # YOLOX-Nano int8: the raw output's SQNR hides it, the detections do not
    yolo = check("openvino", _entry(4.6, f1=0.0), _entry(6.1, f1=0.74),
                 {"y": {"sqnr_db": 6.2}})
    assert not yolo["ok"] and yolo["reason"].endswith("f1 0.00 on openvino, 0.74 on onnxruntime")
    assert yolo["onnxruntime"]["task"] == {"f1": 0.74}
    # its uint8 convolution-inputs form: 0.83 against 0.85 is rounding
    assert check("openvino", _entry(6.7, f1=0.83), _entry(6.7, f1=0.85),
                 {"y": {"sqnr_db": 22.0}})["ok"]


def test_the_lock_installs_openvino_so_ci_runs_its_tests():
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    lock = (ROOT / "requirements.lock").read_text().splitlines()
    assert "--extra openvino" in lock[2]  # the command that regenerates it
    assert any(line.startswith("openvino==") for line in lock)
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert [d.split(">")[0] for d in extras["openvino"]] == ["openvino"]
