"""What the actions of this plugin's rules read: the model file of a dependency, the
dataset folder, and the feeds (the dataset's samples, or seeded random inputs), each
failing with a message that names the target's attribute; a model with a tensor over
the allocation bound (``qbuild_onnx_common.allocation``) is refused as it is read."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from qbuild_onnx_common.allocation import AllocationRefused, check_model
from qbuild_onnx_common.arrays import Feed
from qbuild_onnx_common.providers import dataset_path, model_path

from qbuild import Dep, RunContext

if TYPE_CHECKING:
    import onnx


def model_file(ctx: RunContext, dep: Dep, label: str, attr_name: str = "model") -> Path:
    """The model file of ``dep`` (the attribute ``attr_name``'s dependency ``label``),
    once no tensor of it is over the allocation bound (every rule here runs the model,
    evaluates it node by node or builds arrays from its shapes)."""
    try:
        path = model_path(dep)
    except ValueError as e:
        raise ctx.fail(f"{label} {e}", attr=attr_name) from None
    try:
        check_model(path)
    except AllocationRefused as e:
        e.file = ctx.workspace_path(path)
        raise e.located(attr=attr_name) from None
    return path


def dataset_dir(ctx: RunContext) -> Path:
    """The folder of the ``dataset`` dependency."""
    try:
        path = dataset_path(ctx.inputs["dataset"])
    except ValueError as e:
        raise ctx.fail(f"the dataset {e}", attr="dataset") from None
    return path.parent if path.is_file() else path


def action_feeds(ctx: RunContext, model: onnx.ModelProto,
                 count: int | None = None) -> tuple[list[Feed], str]:
    """(feeds, "dataset" or "synthetic"): ``count`` (else ``max_samples``, else all)
    samples of the dataset when the target has one, otherwise seeded random inputs."""
    from ..checking.feeds import load_dataset, random_feeds

    n = count or ctx.params.get("max_samples") or None
    if ctx.inputs.get("dataset") is not None:
        return load_dataset(dataset_dir(ctx), n, model), "dataset"
    return random_feeds(model, n or 4), "synthetic"
