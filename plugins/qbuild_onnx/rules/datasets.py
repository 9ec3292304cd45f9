"""The ``DatasetInfo`` of a dataset folder an action wrote or copied, read from its
manifest: shared by the dataset rules of ``source`` and ``saved_dataset`` in
``imported``. The dataset code is imported inside the functions, so importing this
imports neither numpy nor onnx."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qbuild_onnx_common.providers import DatasetInfo


def dataset_summary(path: Path) -> dict[str, Any]:
    """A dataset folder's sample count, batch size and inputs (name -> dtype, shape),
    from its manifest alone: no digest of the arrays, so numpy is not imported (the
    model check runs in the main process)."""
    from ..source.datasets import open_dataset

    ds = open_dataset(path)
    return {"count": ds.count, "batch_size": ds.batch_size,
            "inputs": {k: {"dtype": v["dtype"], "shape": v["shape"]}
                       for k, v in ds.manifest["inputs"].items()}}


def dataset_provider(out: Path, info: dict[str, Any] | None = None) -> DatasetInfo:
    """The DatasetInfo of a dataset folder an action wrote."""
    info = info or dataset_summary(out)
    inputs = tuple({"name": k, **v} for k, v in sorted(info["inputs"].items()))
    return DatasetInfo(path=out, samples=info["count"], inputs=inputs,
                       batch_size=info["batch_size"])
