"""Settings of the whole test session: the order in which test files reach pytest-xdist's
workers.

The README's test command hands whole files to the workers (``--dist loadfile``), in
collection order. A long file collected last leaves one core idle while the other
finishes it, so the files known to take longest go first (longest-processing-time-first
scheduling); every other file keeps pytest's order. The list only orders: a file missing
from it, or a name that no longer exists, changes the suite's duration, never its result.
"""

from __future__ import annotations

import pytest

# Longest first, by the summed durations of a full run (``--junitxml``), 2026-11-28.
SLOWEST_FILES = (
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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: place for place, path in enumerate(SLOWEST_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.partition("::")[0], len(rank)))
