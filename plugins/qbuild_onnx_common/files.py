"""Content digests of model files and bytes, and finding a dependency's model or dataset.

Imports only the standard library and qbuild, so rules can use it at module level.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from qbuild import ActionContext, Dep

DATASET_MANIFEST = "dataset.json"


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_bytes(data: bytes) -> str:
    """Hex sha256 of bytes in memory (a serialized model)."""
    return hashlib.sha256(data).hexdigest()


def model_file(ctx: ActionContext, dep: Dep, attr_name: str) -> Path:
    """The one ``.onnx`` output of a dependency (the one its info names, if several)."""
    files = [f for f in dep.files if f.is_file() and f.suffix == ".onnx"]
    name = (dep.info or {}).get("model_file")
    named = [f for f in files if f.name == name] if name else []
    if len(named) == 1:
        return named[0]
    if len(files) != 1:
        shown = ", ".join(f.name for f in dep.files) or "none"
        raise ctx.fail(f"{dep.label} must have exactly one .onnx output (it has: {shown})",
                       attr=attr_name)
    return files[0]


def dataset_dir(ctx: ActionContext, dep: Dep, attr_name: str) -> Path:
    """The folder of a dependency's qbuild dataset (the one holding ``dataset.json``)."""
    roots = [f.parent for f in dep.files if f.name == DATASET_MANIFEST]
    roots = roots or [f for f in dep.files if f.is_dir() and (f / DATASET_MANIFEST).is_file()]
    if len(roots) != 1:
        raise ctx.fail(f"{dep.label} is not a dataset (no {DATASET_MANIFEST})", attr=attr_name)
    return roots[0]
