"""Typed providers of ONNX targets: a model, a dataset, calibration statistics and a
quantized model. Rules declare them (``provides = (OnnxModelInfo,)``), their actions
return instances, and dependents ask for them (``attr.label(providers=[OnnxModelInfo])``)
and read them typed (``dep[OnnxModelInfo].model``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qbuild import Provider


@dataclass(frozen=True)
class OnnxModelInfo(Provider):
    """An ONNX model: its file (one of the target's outputs) and what it declares.

    ``inputs``/``outputs`` are ``{"name", "type", "shape"}`` tables (shape entries are
    ints or symbolic names); ``opset`` is the default-domain opset."""

    model: Path
    opset: int
    ir_version: int
    inputs: tuple[dict[str, Any], ...] = ()
    outputs: tuple[dict[str, Any], ...] = ()


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


def onnx_model_info(path: Path, model: Any = None) -> OnnxModelInfo:
    """``OnnxModelInfo`` of a model file an action wrote (``model``: the loaded
    ``onnx.ModelProto``, when the action has it; else the file is read without its
    external data). Inputs and outputs as ``summary.model_info`` describes them."""
    from .summary import model_info

    if model is None:
        import onnx

        model = onnx.load(str(path), load_external_data=False)
    info = model_info(model)
    return OnnxModelInfo(model=path, opset=int(info["opset"] or 0),
                         ir_version=info["ir_version"], inputs=tuple(info["inputs"]),
                         outputs=tuple(info["outputs"]))
