"""Hook specifications the qbuild_onnx plugin adds for other plugins: custom dataset
readers and evaluation tasks.

A plugin registered under the ``qbuild`` entry-point group implements::

    @qbuild.hookimpl(optionalhook=True)
    def qbuild_dataset_readers():
        return {"wav_chunks": read_wav_chunks}

A reader is ``reader(files: list[Path], options: dict) -> Iterable[dict[str, ndarray]]``:
it yields one sample at a time (input name -> per-sample array). The ``dataset`` rule
with ``reader = "wav_chunks"`` uses it. ``optionalhook=True`` keeps the plugin loadable
by an engine that has not registered this spec yet.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pluggy

hookspec = pluggy.HookspecMarker("qbuild")


@hookspec
def qbuild_dataset_readers() -> dict[str, Callable[..., Any]]:  # type: ignore[empty-body]
    """Return dataset readers keyed by name (all plugins' dicts are merged; a name
    provided twice is an error)."""


@hookspec
def qbuild_eval_tasks() -> dict[str, Callable[..., Any]]:  # type: ignore[empty-body]
    """Return evaluation tasks keyed by name (``evaluate``/``sensitivity``/``auto_quantize``
    with ``task = "<name>"``). A task is ``task(ref_outputs, cand_outputs, options) ->
    dict`` with a numeric ``score`` (higher is better); see ``qbuild_onnx.accuracy.tasks``.
    Implement it with ``@qbuild.hookimpl(optionalhook=True)``."""
