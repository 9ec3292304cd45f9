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


def model_path(dep: Any) -> Path:
    """The model file of a dependency (a ``qbuild.Dep``): its ``OnnxModelInfo.model``,
    or, for a rule that predates providers, its single ``.onnx`` output. Raises
    ValueError saying what it has otherwise."""
    if OnnxModelInfo in dep:
        return dep[OnnxModelInfo].model
    files = [f for f in dep.files if f.suffix == ".onnx"]
    if len(files) != 1:
        names = ", ".join(f.name for f in dep.files) or "none"
        raise ValueError(f"has {len(files)} .onnx outputs ({names}); expected exactly one")
    return files[0]


def dataset_path(dep: Any) -> Path:
    """The folder (or file) of a dataset dependency: its ``DatasetInfo.path``, or its
    first output for a rule that predates providers."""
    if DatasetInfo in dep:
        return dep[DatasetInfo].path
    if not dep.files:
        raise ValueError("has no outputs; expected a dataset")
    return dep.files[0]


def _value_info(value: Any) -> dict[str, Any]:
    import onnx

    tensor = value.type.tensor_type
    shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
             for d in tensor.shape.dim]
    dtype = onnx.helper.tensor_dtype_to_string(tensor.elem_type) if tensor.elem_type else ""
    return {"name": value.name, "dtype": dtype.removeprefix("TensorProto.").lower(),
            "shape": shape}


def onnx_model_info(path: Path, model: Any = None) -> OnnxModelInfo:
    """``OnnxModelInfo`` of a model file an action wrote (``model``: the loaded
    ``onnx.ModelProto``, when the action has it; else the file is read without its
    external data)."""
    if model is None:
        import onnx

        model = onnx.load(str(path), load_external_data=False)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    weights = {t.name for t in model.graph.initializer}
    return OnnxModelInfo(
        model=path, opset=int(opset), ir_version=int(model.ir_version),
        inputs=tuple(_value_info(v) for v in model.graph.input if v.name not in weights),
        outputs=tuple(_value_info(v) for v in model.graph.output))
