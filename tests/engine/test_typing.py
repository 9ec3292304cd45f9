"""The engine and the built-in plugins type-check under ``mypy --strict`` (configuration:
``[tool.mypy]`` in pyproject.toml: ``qbuild/`` and ``plugins/``). Run here so the README's
one test command is also CI's type check.

mypy keeps its cache where it keeps it when run by hand (``.mypy_cache`` in the
checkout): a clean checkout (CI) checks every module, a later run only what changed and
what depends on it (mypy's own incremental mode: 25 s of CPU against 1 s on the project's
machine). A checkout this user cannot write to gets a cache of its own for the run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_engine_and_plugins_pass_mypy_strict(tmp_path):
    pytest.importorskip("mypy", reason="mypy comes with the 'test' extra")
    cache = ROOT / ".mypy_cache" if os.access(ROOT, os.W_OK) else tmp_path
    proc = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(cache)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Success" in proc.stdout
