"""CI runs the README's test command, and its output names the slowest tests (issue 26,
point 10): the suite's speed is visible in every run, so a slow test is seen. The command
runs the suite on every core (pytest-xdist), each test file whole on one worker."""

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


def test_the_readme_test_command_runs_on_every_core_one_file_per_worker():
    options = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    addopts = options["tool"]["pytest"]["ini_options"]["addopts"].split()
    assert addopts[addopts.index("-n") + 1] == "auto"
    assert "--dist" in addopts and addopts[addopts.index("--dist") + 1] == "loadfile"
    # what runs it is installed by the README's first command (the lock) and the extra
    assert any(r.startswith("pytest-xdist") for r in
               options["project"]["optional-dependencies"]["test"])
    lock = (ROOT / "requirements.lock").read_text(encoding="utf-8")
    assert re.search(r"^pytest-xdist==", lock, re.M) and re.search(r"^execnet==", lock, re.M)
