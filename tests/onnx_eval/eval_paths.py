"""Repository paths used by the evaluation tests (a uniquely named module)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "testdata" / "images"
MODELS = ROOT / "testdata" / "models"
