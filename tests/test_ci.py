"""CI runs the README's test command, and its output names the slowest tests (issue 26,
point 10): the suite's speed is visible in every run, so a slow test is seen."""

from __future__ import annotations

import re
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def _readme_test_command() -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```sh\n(.*?)```", readme, re.S)
    commands = [line for block in blocks for line in block.splitlines() if "pytest" in line]
    assert len(commands) == 1, commands
    return commands[0].strip()


def test_ci_runs_the_readme_test_command_which_reports_the_20_slowest_tests():
    command = _readme_test_command()
    ci = (ROOT / ".ci/run").read_text(encoding="utf-8").splitlines()
    assert command in [line.strip() for line in ci]
    options = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    addopts = options["tool"]["pytest"]["ini_options"]["addopts"].split()
    assert "--durations=20" in addopts
