"""Code a rule imports by name at run time is keyed: a `module:function` dataset reader
edited between builds reruns the dataset (the built-in `dataset` rule's `code()`)."""

import os
import sys
import time

import pytest

pytest.importorskip("numpy")

READER = """
import numpy as np


def read(files, options):
    for i in range(3):
        yield {{"x": np.full((1, 2), {value} + i, dtype=np.float32)}}
"""


def test_editing_a_named_dataset_reader_reruns_the_dataset(qbuild_workspace, tmp_path,
                                                           monkeypatch):
    ws = qbuild_workspace
    name = f"reader_{os.getpid()}_{time.monotonic_ns()}"
    (tmp_path / "mods").mkdir()
    module = tmp_path / "mods" / f"{name}.py"
    module.write_text(READER.format(value=1))
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "mods"))
    time.sleep(0.1)
    ws.write("d/BUILD.toml", f'[ds]\nrule = "dataset"\nreader = "{name}:read"\n')
    first = ws.build("//d:ds")
    assert first.ok, first.error
    before = _samples(first.outputs("//d:ds")[0])
    module.write_text(READER.format(value=5))
    second = ws.build("//d:ds", explain=True)
    assert second.ran == ["//d:ds"], second.log
    assert f"rule code changed: {name}.py" in second.explanations["//d:ds"]
    assert before != _samples(second.outputs("//d:ds")[0])
    sys.modules.pop(name, None)


def _samples(data_dir):
    """The dataset's array files' bytes, by name."""
    return {p.name: p.read_bytes() for p in sorted(data_dir.glob("*.npy"))}
