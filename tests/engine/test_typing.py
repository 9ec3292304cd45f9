"""The engine and the built-in plugins type-check under ``mypy --strict`` (configuration:
``[tool.mypy]`` in pyproject.toml: ``qbuild/`` and ``plugins/``). Run here so the README's
one test command is also CI's type check."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_engine_and_plugins_pass_mypy_strict(tmp_path):
    pytest.importorskip("mypy", reason="mypy comes with the 'test' extra")
    proc = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Success" in proc.stdout
