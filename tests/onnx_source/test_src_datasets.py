"""Datasets: format, numpy sources, images (alpha, 16-bit, palette), mismatches, readers."""

from __future__ import annotations

import json
import wave
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from qbuild_onnx.source.datasets import (
    build_numpy_dataset,
    build_reader_dataset,
    check_dataset_against_model,
    dataset_digest,
    find_reader,
    iter_feeds,
    open_dataset,
    write_dataset,
)
from qbuild_onnx.source.images import ImageOptions, build_image_dataset, decode_image
from qbuild_onnx.source.model import validate_model
from qbuild_onnx_common.errors import OnnxError

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "testdata" / "images"
MODELS = ROOT / "testdata" / "models"


def test_numpy_dataset_mapping_batches_and_format(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(10, 3, 4)).astype(np.float32)
    np.save(tmp_path / "a.npy", x)
    np.savez(tmp_path / "b.npz", mask=np.arange(10, dtype=np.int64)[:, None])
    m = build_numpy_dataset(tmp_path / "ds", [tmp_path / "a.npy", tmp_path / "b.npz"],
                            {"x": "a.npy", "m": "b.npz:mask"}, batch_size=4)
    manifest = json.loads((tmp_path / "ds" / "dataset.json").read_text())
    assert manifest["format"] == "qbuild-dataset" and manifest["version"] == 1
    assert manifest["count"] == 10 and m["inputs"]["x"]["shape"] == [10, 3, 4]
    assert np.array_equal(np.load(tmp_path / "ds" / manifest["inputs"]["x"]["file"]), x)
    ds = open_dataset(tmp_path / "ds")
    sizes = [b["x"].shape[0] for b in ds.iter_batches()]
    assert sizes == [4, 4, 2]
    got = np.concatenate([b["x"] for b in ds.iter_batches(3)])
    assert np.array_equal(got, x)
    with pytest.raises(OnnxError, match="no array 'nope'"):
        build_numpy_dataset(tmp_path / "d2", [tmp_path / "b.npz"], {"m": "b.npz:nope"})


def test_digest_is_stable_and_content_sensitive(tmp_path):
    x = np.ones((4, 2), np.float32)
    write_dataset(tmp_path / "a", {"x": x}, batch_size=1)
    write_dataset(tmp_path / "b", {"x": x}, batch_size=3)  # batch size is not content
    assert dataset_digest(tmp_path / "a") == dataset_digest(tmp_path / "b")
    x[2, 1] = 2
    write_dataset(tmp_path / "c", {"x": x})
    assert dataset_digest(tmp_path / "c") != dataset_digest(tmp_path / "a")


def test_images_alpha_greyscale_16bit_palette(tmp_path):
    rgba = np.zeros((4, 4, 4), np.uint8)
    rgba[..., 0] = 200
    rgba[..., 3] = 0  # fully transparent -> background
    rgba[0, 0, 3] = 255
    Image.fromarray(rgba, "RGBA").save(tmp_path / "a.png")
    arr = decode_image(tmp_path / "a.png", background=(10, 20, 30))
    assert arr[1, 1].tolist() == [10, 20, 30] and arr[0, 0].tolist() == [200, 0, 0]
    Image.fromarray(np.full((4, 4), 65535, np.uint16)).save(tmp_path / "g16.png")
    assert decode_image(tmp_path / "g16.png").max() == pytest.approx(255.0)
    pal = Image.new("P", (4, 4), 1)
    pal.putpalette([0, 0, 0, 255, 0, 0] + [0] * 762)
    pal.save(tmp_path / "p.png", transparency=1)
    assert decode_image(tmp_path / "p.png", (0, 0, 255))[2, 2].tolist() == [0, 0, 255]
    la = Image.fromarray(np.stack([np.full((4, 4), 100, np.uint8),
                                   np.full((4, 4), 255, np.uint8)], -1), "LA")
    la.save(tmp_path / "la.png")
    assert decode_image(tmp_path / "la.png").shape == (4, 4, 1)
    # the corpus "pineapple.jpg" is really an RGBA PNG: its transparent border becomes white
    pine = decode_image(IMAGES / "pineapple.jpg")
    assert pine.shape[2] == 3 and pine[0, 0].tolist() == [255, 255, 255]


def test_image_dataset_layout_letterbox_and_augmentation(tmp_path):
    opts = ImageOptions(height=64, width=96, resize="letterbox", align="topleft",
                        pad_value=114, color="BGR", scale=1.0, layout="NHWC", count=14, seed=3)
    build_image_dataset(tmp_path / "ds", [IMAGES], "images", opts, batch_size=2)
    ds = open_dataset(tmp_path / "ds")
    assert ds.count == 14 and ds.inputs["images"] == ("float32", (14, 64, 96, 3))
    a = ds.array("images")
    src = json.loads((tmp_path / "ds" / "dataset.json").read_text())["source"]["images"]
    assert src == sorted(src) and len(src) == 6
    # test_colors.jpg is wider than tall: padding at the bottom, pad value 114
    i = src.index("test_colors.jpg")
    assert np.all(a[i, -1] == 114.0)
    assert not np.array_equal(a[i], a[i + 6])  # augmented copy differs
    build_image_dataset(tmp_path / "ds2", [IMAGES], "images", opts, batch_size=2)
    assert dataset_digest(tmp_path / "ds") == dataset_digest(tmp_path / "ds2")


def test_mismatch_messages_name_input_expected_actual(tmp_path):
    mnist = validate_model(MODELS / "mnist.onnx")
    write_dataset(tmp_path / "f64", {"Input3": np.zeros((2, 1, 28, 28), np.float64)})
    with pytest.raises(OnnxError) as e:
        check_dataset_against_model(open_dataset(tmp_path / "f64").manifest, mnist)
    assert "Input3" in str(e.value) and "float32" in str(e.value) and "float64" in str(e.value)
    write_dataset(tmp_path / "shape", {"Input3": np.zeros((2, 1, 28, 27), np.float32)})
    with pytest.raises(OnnxError) as e:
        check_dataset_against_model(open_dataset(tmp_path / "shape").manifest, mnist)
    assert "Input3" in str(e.value) and "28" in str(e.value) and "27" in str(e.value)
    write_dataset(tmp_path / "name", {"wrong": np.zeros((2, 1, 28, 28), np.float32)})
    with pytest.raises(OnnxError, match="Input3"):
        check_dataset_against_model(open_dataset(tmp_path / "name").manifest, mnist)
    write_dataset(tmp_path / "ok", {"Input3": np.zeros((5, 1, 28, 28), np.float32)},
                  batch_size=4)
    plan = check_dataset_against_model(open_dataset(tmp_path / "ok").manifest, mnist)
    assert plan.batch_size == 1  # the model fixes dim 0 to 1
    with pytest.raises(OnnxError, match="exactly 1"):
        check_dataset_against_model(open_dataset(tmp_path / "ok").manifest, mnist, 4)


def read_wav_chunks(files, options):
    """Example reader: mono 16-bit WAV -> windows of `window` samples for Silero VAD."""
    window = int(options.get("window", 512))
    for f in files:
        with wave.open(str(f), "rb") as w:
            pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
        audio = pcm.astype(np.float32) / 32768.0
        for s in range(0, audio.size - window + 1, window):
            yield {"input": audio[None, s:s + window],
                   "h0": np.zeros((2, 1, 64), np.float32),
                   "c0": np.zeros((2, 1, 64), np.float32)}


def test_custom_reader_wav_for_silero(tmp_path):
    t = np.arange(16000 // 4) / 16000
    pcm = (np.sin(2 * np.pi * 440 * t) * 8000).astype("<i2")
    with wave.open(str(tmp_path / "tone.wav"), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(pcm.tobytes())
    reader = find_reader(f"{__name__}:read_wav_chunks")
    build_reader_dataset(tmp_path / "ds", reader, [tmp_path / "tone.wav"], {"window": 512},
                         name="wav")
    ds = open_dataset(tmp_path / "ds")
    assert ds.count == 7 and ds.inputs["h0"] == ("float32", (7, 2, 1, 64))
    silero = validate_model(MODELS / "silero_vad_v3.1_transformer.onnx")
    plan = check_dataset_against_model(ds.manifest, silero)
    assert plan.batch_size == 1 and set(plan.unbatched) == {"h0", "c0", "input"}
    import onnxruntime as ort

    sess = ort.InferenceSession(str(MODELS / "silero_vad_v3.1_transformer.onnx"),
                                providers=["CPUExecutionProvider"])
    feed = next(iter_feeds(ds, plan))
    assert feed["input"].shape == (1, 512) and sess.run(None, feed)[0].shape == (1, 2, 1)


def test_unknown_reader_lists_available():
    with pytest.raises(OnnxError, match="no dataset reader named 'nope'"):
        find_reader("nope")
