"""The remote cache with the real ONNX rules: MobileNetV2 pre-processed, calibrated and
quantized in one workspace; a second workspace with its own local cache, sharing only a
wsgidav server, runs nothing and gets the same bytes; a quantize-only change downloads
what quantize reads (the pre-processed model, the ranges), not the image dataset."""

from __future__ import annotations

from pathlib import Path

from remote_servers import Wsgidav

from qbuild.build.state import WorkspaceState
from qbuild.store.local import LocalStore
from qbuild.testing import Workspace

REPO = Path(__file__).resolve().parents[2]

BUILD = """
[fp32]
rule = "onnx_model"
src = "mobilenet.onnx"

[pre]
rule = "quant_preprocess"
model = ":fp32"

[images]
rule = "image_dataset"
images = ["images/*"]
input = "input_1:0"
size = [128, 128]
scale = 0.00784313725490196
mean = [1.0]

[calib]
rule = "calibrate"
model = ":pre"
dataset = ":images"

[int8]
rule = "quantize"
model = ":pre"
calibration = ":calib"
per_channel = {per_channel}
"""


def _workspace(tmp_path: Path, name: str) -> Workspace:
    ws = Workspace(tmp_path / name, tmp_path / f"cache-{name}")
    ws.copy(REPO / "testdata/models/mobilenet_v2_128_0.5.onnx", "m/mobilenet.onnx")
    for image in sorted((REPO / "testdata/images").glob("*.jpg")):
        ws.copy(image, f"m/images/{image.name}")
    ws.write("m/BUILD.toml", BUILD.format(per_channel="true"))
    return ws


def test_quantization_pipeline_through_a_shared_wsgidav(tmp_path):
    server = Wsgidav(tmp_path / "dav")
    try:
        a, b = _workspace(tmp_path, "a"), _workspace(tmp_path, "b")
        first = a.build("//m:int8", remote_cache=server.url)
        assert first.ok, first.error
        assert len(first.ran) == 5
        second = b.build("//m:int8", remote_cache=server.url)
        assert second.ok and second.ran == [] and len(second.remote_hits) == 5
        for mine, theirs in zip(first.outputs("//m:int8"), second.outputs("//m:int8")):
            assert mine.read_bytes() == theirs.read_bytes()

        c = _workspace(tmp_path, "c")
        c.write("m/BUILD.toml", BUILD.format(per_channel="false"))
        changed = c.build("//m:int8", remote_cache=server.url)
        assert changed.ok and changed.ran == ["//m:int8"]
        store = LocalStore(c.cache_dir)
        try:
            have = set(store.blob_digests())
        finally:
            store.close()
        key = WorkspaceState(a.path("qbuild-out")).last_keys["//m:images"]
        store = LocalStore(a.cache_dir)
        try:
            result = store.get_action(key)
        finally:
            store.close()
        dataset = {e.digest for e in result.outputs}
        assert dataset and not dataset & have  # the image dataset stayed on the server
        assert changed.remote["blobs_downloaded"] >= 2
    finally:
        server.stop()
