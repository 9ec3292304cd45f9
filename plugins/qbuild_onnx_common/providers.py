"""Typed providers of ONNX targets: a model, a dataset, calibration statistics and a
quantized model. Rules declare them (``provides = (OnnxModelInfo,)``), their actions
return instances, and dependents ask for them (``attr.label(providers=[OnnxModelInfo])``)
and read them typed (``dep[OnnxModelInfo].model``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qbuild import Dep, Provider

if TYPE_CHECKING:
    from onnx import ModelProto


@dataclass(frozen=True)
class OnnxModelInfo(Provider):
    """An ONNX model: its file (one of the target's outputs) and what it declares.

    ``inputs``/``outputs`` are ``{"name", "dtype", "shape"}`` tables (numpy dtype names
    such as "float32", as datasets use; shape entries are ints, symbolic names or None);
    ``opset`` is the default-domain opset.

    What earlier steps recorded for later ones (empty for a model as it came):
    ``rewrites``: the node names a graph rewrite removed (``quant_preprocess``), so that
    ``quantize`` can say why a name is gone; ``promoted``: the tensors a precision
    override kept above 8 bits or in float, and ``float_joins``: the Concat joins kept
    float (``quantize``; passed on by the rules that rewrite a quantized model:
    ``bias_correction``, ``adaround``, ``select_best``, ``lower_integer``)."""

    model: Path
    opset: int
    ir_version: int
    inputs: tuple[dict[str, Any], ...] = ()
    outputs: tuple[dict[str, Any], ...] = ()
    rewrites: dict[str, Any] | None = None
    promoted: tuple[str, ...] = ()
    float_joins: tuple[str, ...] = ()


@dataclass(frozen=True)
class DatasetInfo(Provider):
    """A dataset of model inputs: the folder or file holding it, how many samples, and
    the input names and shapes it feeds."""

    path: Path
    samples: int
    inputs: tuple[dict[str, Any], ...] = ()
    batch_size: int = 1


@dataclass(frozen=True)
class CalibrationInfo(Provider):
    """Calibration statistics (activation ranges) for one model."""

    table: Path
    method: str
    samples: int = 0


@dataclass(frozen=True)
class QuantizedModelInfo(Provider):
    """A quantized model (QDQ or integer): its format and weight/activation types, and
    the tensors that stayed in float."""

    model: Path
    format: str
    weight_type: str
    activation_type: str
    float_nodes: tuple[str, ...] = ()


def model_path(dep: Dep) -> Path:
    """The model file of a dependency (a ``qbuild.Dep``): its ``OnnxModelInfo.model``,
    or, for a third-party rule that predates providers (declares no ``provides``, so
    analysis could not refuse it), its single ``.onnx`` output. Raises ValueError saying
    what it has otherwise."""
    if OnnxModelInfo in dep:
        return dep[OnnxModelInfo].model
    files = [f for f in dep.files if f.suffix == ".onnx"]
    if len(files) != 1:
        names = ", ".join(f.name for f in dep.files) or "none"
        raise ValueError(f"has {len(files)} .onnx outputs ({names}); expected exactly one")
    return files[0]


def dataset_path(dep: Dep) -> Path:
    """The folder (or file) of a dataset dependency: its ``DatasetInfo.path``, or its
    first output for a rule that predates providers."""
    if DatasetInfo in dep:
        return dep[DatasetInfo].path
    if not dep.files:
        raise ValueError("has no outputs; expected a dataset")
    return dep.files[0]


def onnx_model_info(path: Path, model: ModelProto | None = None, **recorded: Any
                    ) -> OnnxModelInfo:
    """``OnnxModelInfo`` of a model file an action wrote (``model``: the loaded
    ``onnx.ModelProto``, when the action has it; else the file is read without its
    external data). Inputs and outputs as ``summary.model_info`` describes them;
    ``recorded``: the fields earlier steps recorded (``rewrites``, ``promoted``,
    ``float_joins``)."""
    from .summary import model_info

    if model is None:
        from .models import load_model

        model = load_model(path, external_data=False)
    info = model_info(model)
    return OnnxModelInfo(model=path, opset=int(info["opset"] or 0),
                         ir_version=info["ir_version"], inputs=tuple(info["inputs"]),
                         outputs=tuple(info["outputs"]), **recorded)
