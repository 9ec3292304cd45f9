"""Repository paths used by the lowering tests (a uniquely named module: every test
folder has its own conftest.py, so tests must not import from ``conftest``)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
IMAGES = sorted(p for p in (ROOT / "testdata" / "images").glob("*") if p.suffix in (".jpg", ".png"))
MOBILENET = ROOT / "testdata" / "models" / "mobilenet_v2_128_0.5.onnx"
YOLOX = ROOT / "examples" / "yolo" / "yolox_nano.onnx"
YOLOV8 = ROOT / "testdata" / "models" / "yolov8_tiny.onnx"
