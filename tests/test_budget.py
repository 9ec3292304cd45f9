"""Budgets that only go down: the count of functions above a complexity threshold
(ruff's McCabe check, C901) in the engine and the built-in plugins, and no function
above the ceiling at all. Lower a number here when a function is simplified; raising one
needs a reason in the commit that does it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
THRESHOLD = 15
"""McCabe complexity above which a function counts against the budget."""
CEILING = 25
"""No function may be more complex than this: split it into named steps."""
BUDGET = {"qbuild": 5, "plugins": 4}
"""Functions above ``THRESHOLD``, per folder, when this budget was last lowered."""


def _complex_functions(folder: str, limit: int) -> list[str]:
    pytest.importorskip("ruff", reason="ruff comes with the 'test' extra")
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--select", "C901", "--output-format", "json",
         "--config", f"lint.mccabe.max-complexity={limit}", "--no-cache", folder],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    found = json.loads(proc.stdout or "[]")
    return sorted(f"{Path(item['filename']).relative_to(ROOT)}:{item['location']['row']}: "
                  f"{item['message']}" for item in found)


@pytest.mark.parametrize("folder", sorted(BUDGET))
def test_complex_functions_stay_within_the_budget(folder):
    found = _complex_functions(folder, THRESHOLD)
    assert len(found) <= BUDGET[folder], (
        f"{len(found)} functions in {folder}/ above McCabe {THRESHOLD} (budget "
        f"{BUDGET[folder]}): simplify one, or lower nothing and say why\n" + "\n".join(found))


@pytest.mark.parametrize("folder", sorted(BUDGET))
def test_no_function_above_the_ceiling(folder):
    found = _complex_functions(folder, CEILING)
    assert not found, "split these into named steps:\n" + "\n".join(found)
