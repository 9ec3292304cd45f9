"""Shared set-up for the runtime-target tests: the plugins folder on sys.path (as the
other plugin test folders do)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "plugins") not in sys.path:
    sys.path.insert(0, str(ROOT / "plugins"))
