"""Issue 26 through the real dataset and calibration rules: a bad staged image named by
its workspace path (point 7), a wrong ``input`` reported at the dataset (point 9),
calibration progress on the live line (point 9)."""

from __future__ import annotations

from pathlib import Path

from qbuild.core import live

ROOT = Path(__file__).resolve().parents[2]
MNIST = ROOT / "testdata/models/mnist.onnx"
IMAGES = ROOT / "testdata/images"

BUILD = """
[mnist]
rule = "onnx_model"
src = "mnist.onnx"

[calib_files]
rule = "filegroup"
srcs = ["calib/dog.jpg", "calib/notes.txt"]

[imgs]
rule = "image_dataset"
images = {images}
input = "{input}"
size = [28, 28]
color = "GRAY"

[calib]
rule = "calibrate"
model = ":mnist"
dataset = ":imgs"
"""


def _workspace(ws, images: str, input_name: str = "Input3"):
    ws.copy(MNIST, "d/mnist.onnx")
    ws.copy(IMAGES / "dog.jpg", "d/calib/dog.jpg")
    ws.write("d/calib/notes.txt", "not an image\n")
    ws.write("d/BUILD.toml", BUILD.format(images=images, input=input_name))
    return ws


def test_a_bad_image_is_named_by_its_workspace_path_not_its_sandbox_path(qbuild_workspace):
    ws = _workspace(qbuild_workspace, '["calib/dog.jpg", "calib/notes.txt"]')
    result = ws.build("//d:imgs")
    assert not result.ok
    assert "d/calib/notes.txt, target //d:imgs, attribute 'images': not an image" in \
        result.error, result.error
    ws.write("d/BUILD.toml", BUILD.format(images='[":calib_files"]', input="Input3"))
    result = ws.build("//d:imgs")
    assert not result.ok
    # through a filegroup: the source's own path, as the example asks
    assert "d/calib/notes.txt, target //d:imgs" in result.error, result.error
    assert ".dep0" not in result.error and ".src/" not in result.error


def test_a_wrong_input_name_is_reported_at_the_dataset_target(qbuild_workspace):
    ws = _workspace(qbuild_workspace, '["calib/dog.jpg"]', input_name="image")
    result = ws.build("//d:calib")
    assert not result.ok
    assert ("d/BUILD.toml, target //d:imgs, attribute 'input': model input 'Input3' has "
            "no data in the dataset (dataset inputs: image) (set `input` to the model's "
            "input name)") in result.error, result.error


def test_calibration_reports_samples_done_of_all(qbuild_workspace, monkeypatch):
    seen: dict[str, list[tuple[int, int] | None]] = {}
    forget = live.forget

    def spy(label: str) -> None:  # what the live line shows as the action ends
        seen.setdefault(label, []).append(live.read(label))
        forget(label)

    monkeypatch.setattr(live, "forget", spy)
    ws = qbuild_workspace
    ws.copy(MNIST, "m/mnist.onnx")
    ws.write("m/BUILD.toml", '[mnist]\nrule = "onnx_model"\nsrc = "mnist.onnx"\n'
             '[data]\nrule = "synthetic_dataset"\nmodel = ":mnist"\ncount = 3\n'
             '[calib]\nrule = "calibrate"\nmodel = ":mnist"\ndataset = ":data"\n'
             'method = "entropy"\nnum_bins = 64\nnum_quantized_bins = 16\n')
    result = ws.build("//m:calib")
    assert result.ok, result.error
    assert seen["//m:calib"] == [(6, 6)]  # both passes of a histogram method


SHARED = """
[data]
rule = "image_dataset"
images = ["calib/dog.jpg"]
input = "Input3"
size = [28, 28]
color = "GRAY"
resize = "crop"
scale = 0.5
mean = [0.25]
variants = {{ eval = {{ images = ["eval/wolves.jpg"], count = 3, seed = 7 }} {more} }}

[by_hand]
rule = "image_dataset"
images = ["eval/wolves.jpg"]
input = "Input3"
size = [28, 28]
color = "GRAY"
resize = "crop"
scale = 0.5
mean = [0.25]
count = 3
seed = 7
"""


def test_a_dataset_variant_states_the_shared_settings_once(qbuild_workspace):
    ws = qbuild_workspace
    ws.copy(IMAGES / "dog.jpg", "d/calib/dog.jpg")
    ws.copy(IMAGES / "wolves.jpg", "d/eval/wolves.jpg")
    ws.write("d/BUILD.toml", SHARED.format(more=""))
    result = ws.build("//d:data", "//d:data.eval", "//d:by_hand")
    assert result.ok, result.error
    from qbuild_onnx_common.providers import DatasetInfo

    assert result.provider("//d:data", DatasetInfo).samples == 1
    assert result.provider("//d:data.eval", DatasetInfo).samples == 3

    def arrays(label: str) -> dict[str, bytes]:
        folder = result.outputs(label)[0]
        return {p.name: p.read_bytes() for p in folder.iterdir() if p.suffix == ".npy"}

    assert arrays("//d:data.eval") == arrays("//d:by_hand")  # the same settings
    # a change to the shared settings reaches both; a variant's own change only it
    ws.write("d/BUILD.toml", SHARED.format(more="").replace(
        "count = 3, seed = 7", "count = 3, seed = 8"))
    again = ws.build("//d:data", "//d:data.eval")
    assert again.ok and again.ran == ["//d:data.eval"]


def test_a_bad_variant_is_one_line_naming_the_attribute(qbuild_workspace):
    ws = qbuild_workspace
    ws.copy(IMAGES / "dog.jpg", "d/calib/dog.jpg")
    ws.copy(IMAGES / "wolves.jpg", "d/eval/wolves.jpg")
    ws.write("d/BUILD.toml", SHARED.format(more=", test = 3"))
    result = ws.build("//d:data")
    assert result.exit_code == 2
    assert ("d/BUILD.toml, target //d:data, attribute 'variants': variant 'test': expected "
            "a table of attributes to change") in result.error
    ws.write("d/BUILD.toml", SHARED.format(more=", test = { seeds = 1 }"))
    result = ws.build("//d:data.test")
    assert result.exit_code == 2
    assert "target //d:data.test, attribute 'seeds'" in result.error
