"""Settings of the whole test session: how many pytest-xdist workers ``-n auto`` starts and
the order in which test files reach them.

Tests wait on subprocesses, servers and the disk part of the time (with one worker per
core the cores were idle a sixth of the run), so ``-n auto`` starts one and a half workers per core
(the README's command caps them at 4). On 2 cores, quiet, the whole suite took 5 min 6 s
with 2 workers, 4 min 39 s with 3 and 5 min 42 s with 4 (2026-11-28, one run each; 8.6
CPU-minutes with 2 or 3 workers, 10.9 with 4: more workers than that only contend).

The README's test command hands whole files to the workers (``--dist loadfile``), in
collection order. A long file collected last leaves one core idle while the other
finishes it, so the files known to take longest go first (longest-processing-time-first
scheduling); every other file keeps pytest's order. The list only orders: a file missing
from it, or a name that no longer exists, changes the suite's duration, never its result.
"""

from __future__ import annotations

import os

import pytest

# Longest first, by the summed durations of a full run (``--junitxml``), 2026-11-28.
SLOWEST_FILES = (
    "tests/engine/test_typing.py",  # mypy --strict: 46 s with no cache (a fresh clone)
    "tests/test_docs.py",
    "tests/engine/test_store_damage.py",
    "tests/engine/test_remote_faults.py",
    "tests/dtypes/test_dtypes_retarget.py",
    "tests/engine/test_fast_path_property.py",
    "tests/engine/test_differential.py",
    "tests/onnx_eval/test_eval_set_size.py",
    "tests/lower/test_lower_models.py",
    "tests/engine/test_everyday.py",
    "tests/onnx_eval/test_auto_choice.py",
    "tests/engine/test_v2_example_plugin.py",
    "tests/engine/test_perf_caches.py",
    "tests/engine/test_remote_hostile.py",
    "tests/onnx_accuracy/test_acc_yolo_recipe.py",
    "tests/engine/test_third_party_plugin.py",
    "tests/lower/test_lower_rule.py",
    "tests/engine/test_cli.py",
    "tests/onnx_source/test_src_calibration.py",
    "tests/distributed/test_dask_processes.py",
    "tests/onnx_eval/test_auto_failures.py",
    "tests/engine/test_remote_cache.py",
    "tests/onnx_eval/test_labelled_metrics.py",
    "tests/runtimes/test_runtime_rules.py",
    "tests/lower/test_lower_tables.py",
    "tests/onnx_source/test_src_splits.py",
)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)
    return max(1, cores + cores // 2)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: place for place, path in enumerate(SLOWEST_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.partition("::")[0], len(rank)))
