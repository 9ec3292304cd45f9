"""Repository paths used by the accuracy-tool tests (a uniquely named module: every test
folder has its own conftest.py, so tests must not import from ``conftest``)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "testdata" / "images"
MODELS = ROOT / "testdata" / "models"
