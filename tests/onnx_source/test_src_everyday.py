"""Issue 15 through the real rules: inapplicable attributes stay out of keys, image
folders, analysis-time shape checks, failure messages without sandbox paths."""

from __future__ import annotations

import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MNIST = ROOT / "testdata/models/mnist.onnx"
IMAGES = ROOT / "testdata/images"

CALIB = """
[mnist]
rule = "onnx_model"
src = "mnist.onnx"

[data]
rule = "synthetic_dataset"
model = ":mnist"
count = 4

[calib]
rule = "calibrate"
model = ":mnist"
dataset = ":data"
num_bins = 128
num_quantized_bins = 32
matrix = { method = ["minmax", "entropy", "percentile"] }
"""


def test_an_attribute_for_one_method_does_not_rerun_the_others(qbuild_workspace):
    ws = qbuild_workspace
    ws.copy(MNIST, "m/mnist.onnx")
    ws.write("m/BUILD.toml", CALIB)
    first = ws.build("//m:calib")
    assert first.ok, first.error
    percentile_json = ws.path("qbuild-out/m/@calib@method=percentile/calibration.json")
    before = percentile_json.read_bytes()
    ws.write("m/BUILD.toml", CALIB.replace("num_bins = 128", "num_bins = 128\npercentile = 99.0"))
    second = ws.build("//m:calib")
    assert second.ok, second.error
    assert second.ran == ["//m:calib@method=percentile"]
    assert sorted(second.cached) == ["//m:calib@method=entropy", "//m:calib@method=minmax",
                                     "//m:data", "//m:mnist"]
    # and the one it applies to really used it
    assert percentile_json.read_bytes() != before
    shown = ws.cli("query", "//m:calib@method=minmax", "--output=build").stdout
    assert "percentile" not in shown.split("# not applicable")[0]
    assert "# not applicable here (kept at default): " in shown


IMAGE_BUILD = """
[imgs]
rule = "image_dataset"
images = ["good_dir"]
input = "Input3"
size = [28, 28]
color = "GRAY"
"""


def test_image_dataset_takes_a_folder_sorted_and_ignores_other_files(qbuild_workspace):
    ws = qbuild_workspace
    for name in ("wolves.jpg", "dog.jpg"):
        ws.copy(IMAGES / name, f"d/good_dir/{name}")
    ws.write("d/good_dir/README.txt", "not an image")
    ws.write("d/BUILD.toml", IMAGE_BUILD)
    first = ws.build("//d:imgs")
    assert first.ok, first.error
    data = first.outputs("//d:imgs")[0]
    from qbuild_onnx_common.providers import DatasetInfo

    assert first.provider("//d:imgs", DatasetInfo).samples == 2
    snapshot = {p.name: p.read_bytes() for p in data.iterdir()}
    # the same folder written in another order gives the same bytes
    shutil.rmtree(ws.path("d/good_dir"))
    for name in ("dog.jpg", "wolves.jpg"):
        ws.copy(IMAGES / name, f"d/good_dir/{name}")
    again = ws.build("//d:imgs")
    assert again.ok and {p.name: p.read_bytes() for p in data.iterdir()} == snapshot
    # a new image in the folder is seen, through the CLI's no-op fast path as well
    assert ws.cli("build", "//d:imgs").code == 0
    ws.copy(IMAGES / "pineapple.jpg", "d/good_dir/pineapple.jpg")
    rebuilt = ws.cli("build", "//d:imgs")
    assert rebuilt.code == 0 and "1 actions run" in rebuilt.stderr, rebuilt.stderr
    ws.write("d/BUILD.toml", IMAGE_BUILD.replace("good_dir", "empty"))
    ws.path("d/empty").mkdir()
    empty = ws.build("//d:imgs")
    assert empty.exit_code == 2 and "attribute 'images': folder 'empty' holds no files" in \
        empty.error


def test_image_size_shape_is_an_analysis_error(qbuild_workspace):
    ws = qbuild_workspace
    ws.copy(IMAGES / "dog.jpg", "d/dog.jpg")
    ws.write("d/BUILD.toml", IMAGE_BUILD.replace('["good_dir"]', '["dog.jpg"]')
             .replace("[28, 28]", "[224, 224, 3]"))
    result = ws.build("//d:imgs")
    assert result.exit_code == 2
    assert ("d/BUILD.toml, target //d:imgs, attribute 'size': size must be [height, width] "
            "(2 integers), got [224, 224, 3]") in result.error
    ws.write("d/BUILD.toml", IMAGE_BUILD.replace('["good_dir"]', '"dog.jpg"'))
    result = ws.build("//d:imgs")
    assert result.exit_code == 2 and "attribute 'images': expected a list of files" in \
        result.error


def test_failure_messages_name_the_source_not_the_sandbox(qbuild_workspace):
    ws = qbuild_workspace
    ws.write_bytes("m4/trunc.onnx", MNIST.read_bytes()[:3000])
    ws.write("m4/BUILD.toml", '[t]\nrule = "onnx_model"\nsrc = "trunc.onnx"\n')
    out = ws.cli("build", "//m4:t")
    assert out.code == 1
    assert "): m4/trunc.onnx, target //m4:t, attribute 'src': " in out.stderr
    assert "cache/tmp" not in out.stderr
    assert all("/tmp/" not in line for line in out.stderr.splitlines() if "; cache" not in line)


def test_smoothquant_error_does_not_point_at_a_missing_option(qbuild_workspace):
    ws = qbuild_workspace
    ws.copy(MNIST, "m/mnist.onnx")
    ws.write("m/BUILD.toml", CALIB + """
[q]
rule = "quantize"
model = ":mnist"
calibration = ":calib@method=minmax"
extra_options = { SmoothQuant = true }
""")
    result = ws.build("//m:q")
    assert not result.ok
    assert "extra_options.SmoothQuant" in result.error
    assert "set it on the calibrate target" not in result.error
    assert "equalize target with method = \"smoothquant\"" in result.error
    ws.write("m/BUILD.toml", CALIB + """
[q]
rule = "quantize"
model = ":mnist"
calibration = ":calib@method=minmax"
extra_options = { CalibMovingAverage = true }
""")
    result = ws.build("//m:q")
    assert "set moving_average = true on the calibrate target" in result.error


def test_sensitivity_kinds_are_checked_at_analysis(qbuild_workspace):
    ws = qbuild_workspace
    ws.copy(MNIST, "m/mnist.onnx")
    ws.write("m/BUILD.toml", CALIB + """
[sens]
rule = "sensitivity"
model = ":mnist"
reference = ":mnist"
dataset = ":data"
kinds = ["activations"]
""")
    result = ws.build("//m:sens")
    assert result.exit_code == 2 and result.ran == []
    assert ("m/BUILD.toml, target //m:sens, attribute 'kinds': unknown site kind(s) "
            "['activations']") in result.error


def test_a_string_where_quantize_declares_a_list_is_an_analysis_error(qbuild_workspace):
    ws = qbuild_workspace
    ws.copy(MNIST, "m/mnist.onnx")
    ws.write("m/BUILD.toml", CALIB + """
[q]
rule = "quantize"
model = ":mnist"
calibration = ":calib@method=minmax"
nodes_to_exclude = "Conv_0"
""")
    result = ws.build("//m:q")
    assert result.exit_code == 2 and result.ran == []
    assert ("m/BUILD.toml, target //m:q, attribute 'nodes_to_exclude': expected a list of "
            'strings, got a string (write ["Conv_0"])') in result.error
