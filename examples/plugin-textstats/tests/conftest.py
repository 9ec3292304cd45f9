"""Lets the tests run from a source checkout, before the plugin is installed."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
