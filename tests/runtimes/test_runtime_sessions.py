"""The runtime interface on real runtimes: OpenVINO and onnxruntime load the same real
models and compute them alike (a tiny CNN built here with a dynamic batch, models from
testdata/), OpenVINO reports the float precision it picks on this CPU, its errors are one
line, the one timing loop times sessions of both, and a missing OpenVINO is one line
naming the extra (OpenVINO hidden from a real subprocess)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest
from qbuild_onnx_common.errors import OnnxError
from qbuild_onnx_common.runtimes import get, key_facts, missing
from qbuild_onnx_common.runtimes.base import DEFAULT, FP32
from qbuild_onnx_common.runtimes.timing import fastest, interleaved
from rt_models import MODELS, ROOT, images, tiny_cnn

pytest.importorskip("openvino", reason="the openvino extra is not installed "
                                       "(pip install -r requirements.lock installs it)")


def test_openvino_and_onnxruntime_compute_a_float_cnn_alike(tmp_path):
    path = tmp_path / "tiny.onnx"
    onnx.save(tiny_cnn(), str(path))
    ort, ov = get("onnxruntime").load(path), get("openvino").load(path, precision=FP32)
    assert [p.name for p in ov.get_inputs()] == ["x"]
    assert [p.name for p in ov.get_outputs()] == ["c1"]
    for batch in (1, 3, 1):  # a dynamic batch: one compiled model per shape, reused
        x = images(batch, batch, (3, 16, 16))
        (a,), (b,) = ort.run(None, {"x": x}), ov.run(None, {"x": x})
        assert b.shape == (batch, 4, 16, 16) and b.dtype == np.float32
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-4)
    (named,) = ov.run(["c1"], {"x": x})
    assert np.array_equal(named, b)
    assert ov.precision() == "fp32"  # asked for


@pytest.mark.parametrize("name", ["mnist.onnx", "mobilenet_v2_128_0.5.onnx"])
def test_fixture_models_run_on_openvino_as_on_onnxruntime(name):
    from qbuild_onnx.accuracy.metrics import compare_outputs, run_model
    from qbuild_onnx_common.runtimes.ort_runtime import OnnxRuntime

    path = MODELS / name
    ort = OnnxRuntime().load(path)
    first = ort.get_inputs()[0]
    shape = [d if isinstance(d, int) else 1 for d in first.shape]  # type: ignore[attr-defined]
    feeds = [{first.name: np.random.default_rng(k).random(shape, dtype=np.float32)}
             for k in range(2)]
    ov = get("openvino").load(path, precision=FP32)
    assert [p.name for p in ov.get_outputs()] == [p.name for p in ort.get_outputs()]
    cmp = compare_outputs(run_model(ort, feeds), run_model(ov, feeds))
    assert all(float(m["sqnr_db"]) > 60 for m in cmp.values()), cmp


def test_float_forms_start_with_fp32_and_follow_the_cpus_default():
    ov = get("openvino")
    forms = ov.float_forms()
    assert (forms[0].name, forms[0].precision) == ("fp32", FP32)
    facts = ov.facts()
    default = facts["default_precision"]
    # bf16 only where the CPU has it (this machine's Xeon has AVX-512 VNNI, no BF16)
    if "BF16" not in facts["capabilities"].split():
        assert default == "fp32"
    assert [f.name for f in forms] == (["fp32"] if default == "fp32" else ["fp32", default])
    assert all(f.precision == DEFAULT for f in forms[1:])
    assert [f.name for f in get("onnxruntime").float_forms()] == ["fp32"]


def test_openvino_errors_are_one_line(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(OnnxError) as e:
        get("openvino").load(bad)
    assert e.value.message.startswith("openvino cannot load bad.onnx: ")
    assert "\n" not in e.value.message
    path = tmp_path / "tiny.onnx"
    onnx.save(tiny_cnn(), str(path))
    with pytest.raises(OnnxError) as e:  # a feed of the wrong rank
        get("openvino").load(path).run(None, {"x": np.zeros((3, 16, 16), np.float32)})
    assert e.value.message.startswith("openvino cannot ") and "\n" not in e.value.message


def test_one_timing_loop_times_sessions_of_both_runtimes(tmp_path):
    path = tmp_path / "tiny.onnx"
    onnx.save(tiny_cnn(), str(path))
    sessions = {"ort": get("onnxruntime").load(path), "ov": get("openvino").load(path)}
    times = interleaved(sessions, {"x": images(0, 1, (3, 16, 16))}, rounds=4, warmup=1)
    for name in sessions:
        assert len(times.cpu[name]) == len(times.wall[name]) == 4
        assert all(c > 0 for c in times.cpu[name])  # both compute on the calling thread
    assert fastest(times, ["ort", "ov"]) in ("ort", "ov")


def test_runtime_version_keys_only_the_other_runtimes():
    import importlib.metadata

    assert key_facts("onnxruntime") == {}  # every ONNX rule is keyed by its version
    assert key_facts("openvino") == {"runtime": "openvino",
                                     "openvino": importlib.metadata.version("openvino")}
    assert missing("openvino") is None and missing("onnxruntime") is None


HIDDEN = "import sys; sys.modules['openvino'] = None\n"  # `import openvino` now fails


def _hidden(code: str, cwd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", HIDDEN + textwrap.dedent(code)], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_missing_openvino_is_one_line_naming_the_extra(tmp_path):
    out = _hidden(f"""
        sys.path.insert(0, {str(ROOT / 'plugins')!r})
        from qbuild_onnx_common.errors import OnnxError
        from qbuild_onnx_common.runtimes import missing
        from qbuild_onnx_common.runtimes.ov_runtime import require
        print(missing("openvino"))
        try:
            require()
        except OnnxError as e:
            print(e.attr, e.message)
        """, str(tmp_path))
    assert out.returncode == 0, out.stderr
    want = "needs openvino, which is not installed: pip install 'qbuild[openvino]'"
    first, second = out.stdout.splitlines()
    assert first == f"runtime 'openvino' {want}"
    assert second == "runtime runtime 'openvino' needs OpenVINO, which is not installed: " \
                     "pip install 'qbuild[openvino]'"


def test_a_build_on_a_missing_openvino_stops_at_analysis_naming_the_attribute(tmp_path):
    ws = tmp_path / "ws"
    (ws / "m").mkdir(parents=True)
    (ws / "qbuild.toml").write_text(f'[settings]\ncache_dir = "{(tmp_path / "c").as_posix()}"\n')
    onnx.save(tiny_cnn(), str(ws / "m" / "f.onnx"))
    np.save(ws / "m" / "x.npy", images(0, 2, (3, 16, 16)))
    (ws / "m" / "BUILD.toml").write_text(textwrap.dedent("""
        [f]
        rule = "onnx_model"
        src = "f.onnx"

        [data]
        rule = "numpy_dataset"
        files = ["x.npy"]
        mapping = { x = "x.npy" }

        [ev]
        rule = "evaluate"
        models = [":f"]
        reference = ":f"
        dataset = ":data"
        runtime = "openvino"
        """))
    out = _hidden("""
        from qbuild.cli import main
        sys.exit(main(["build", "//m:ev"]))
        """, str(ws))
    assert out.returncode == 2, out.stdout + out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert lines[0] == ("ERROR: m/BUILD.toml, target //m:ev, attribute 'runtime': runtime "
                        "'openvino' needs openvino, which is not installed: "
                        "pip install 'qbuild[openvino]'")



def test_the_fastest_float_form_is_the_baseline_and_both_are_reported(tmp_path):
    """On a CPU where OpenVINO picks bf16 the float model is timed twice; here (no BF16)
    the bf16 form is asked for by name, which OpenVINO accepts, to run the same path."""
    from qbuild_onnx.auto.timing import float_sessions, summarise, time_candidates
    from qbuild_onnx.rules.accuracy import _latency

    path = tmp_path / "tiny.onnx"
    onnx.save(tiny_cnn(), str(path))
    ov = get("openvino")
    bf16 = ov.load(path, precision="bf16")
    assert bf16.precision() == "bf16"
    feed = {"x": images(0, 1, (3, 16, 16))}
    # evaluate: the float model's forms and a candidate, the baseline the faster form
    sessions = {"//f": ov.load(path, precision=FP32), "//f [bf16]": bf16,
                "//q": ov.load(path)}
    report = {"models": {"//q": {}}, "runtime": {"float_forms": ["fp32", "bf16"]}}
    _latency(report, sessions, feed, 4, ["//f", "//f [bf16]"])
    lat = report["latency"]
    forms = lat["float_forms"]
    assert set(forms) == {"fp32", "bf16"}
    faster = min(forms, key=lambda f: (forms[f]["cpu"]["median_ms"], f != "fp32"))
    assert lat["baseline"] == faster and lat["reference"] == forms[faster]
    assert report["reference_latency_ms"] == forms[faster]["median_ms"]
    # auto_quantize's timing: a twin per form, the candidate's ratio to the faster form
    names = {n: s for f in ("fp32", "bf16") for n, s in zip(
        float_sessions(f), (sessions["//f"] if f == "fp32" else bf16,) * 2, strict=True)}
    doc = summarise(time_candidates({**names, "u8": sessions["//q"]}, feed, 4, 1), 1,
                    ["fp32", "bf16"])
    assert set(doc["float_forms"]) == {"fp32", "bf16"} and set(doc["candidates"]) == {"u8"}
    assert doc["baseline"] == min(doc["float_forms"], key=lambda f: (doc["float_forms"][f],
                                                                     f != "fp32"))
    assert doc["float_median_ms"] == doc["float_forms"][doc["baseline"]]
    with pytest.raises(OnnxError, match="no float precision 'int3'"):
        ov.load(path, precision="int3")
