"""A short run of bench/stress_kill9.py: builds killed with SIGKILL at random moments
never leave a stale or corrupt output; the next build gives a clean build's bytes."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "stress_kill9.py"


def test_kill_9_at_random_points_never_poisons_the_cache(tmp_path):
    spec = importlib.util.spec_from_file_location("stress_kill9", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    problems = module.stress(points=4, seed=7, work=tmp_path, log=lambda _line: None)
    assert problems == []
