"""Fixtures for the evaluation-task and auto-quantization tests."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for p in (ROOT / "plugins", ROOT / "testdata" / "generators"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))
