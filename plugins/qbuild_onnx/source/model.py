"""Source ONNX models: load, validate and describe a model file, and stage it with its
external data.

Owns: the checks a model must pass before anything else touches it (a readable ONNX
protobuf, ``onnx.checker`` with ``full_check=True`` run on the *path* so models over 2 GB
and external data work, external-data locations that stay inside the model's folder), the
model "info" dict passed to dependents (IR version, opsets per domain, inputs and outputs
with dtypes and shapes, symbolic dims as strings), and file hashing.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path, PurePosixPath
from typing import Any

from qbuild import RuleError

DEFAULT_DOMAIN = "ai.onnx"


class ModelError(RuleError):
    """A model file that cannot be used (not ONNX, truncated, invalid, unsafe data paths)."""


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _load_proto_without_data(path: Path):
    import onnx
    from google.protobuf.message import DecodeError

    if not path.is_file():
        raise ModelError("model file does not exist", file=path)
    if path.stat().st_size == 0:
        raise ModelError("model file is empty (0 bytes): not an ONNX model", file=path)
    try:
        model = onnx.load(str(path), load_external_data=False)
    except DecodeError as e:
        raise ModelError(
            f"not a readable ONNX model (protobuf decode failed: {e}); "
            "the file is truncated, corrupt or not ONNX",
            file=path,
        ) from None
    except Exception as e:  # onnx raises several types for garbage input
        raise ModelError(f"not a readable ONNX model: {e}", file=path) from None
    if model.ir_version <= 0 or not model.HasField("graph"):
        raise ModelError(
            "not an ONNX model: no IR version or graph found (is this really an .onnx file?)",
            file=path,
        )
    return model


def _external_locations(model) -> list[str]:
    """Distinct external-data ``location`` values of every tensor in the model, sorted."""
    from onnx import external_data_helper

    locations = set()
    for tensor in external_data_helper._get_all_tensors(model):
        if external_data_helper.uses_external_data(tensor):
            info = external_data_helper.ExternalDataInfo(tensor)
            locations.add(info.location)
    return sorted(locations)


def check_external_locations(model_path: Path, locations: list[str]) -> list[str]:
    """Refuse external-data locations that are absolute or escape the model's folder.

    Returns the locations normalised to POSIX relative paths (what the model refers to).
    """
    base = model_path.parent.resolve()
    clean = []
    for loc in locations:
        if not loc:
            raise ModelError("a tensor has external data with an empty location", file=model_path)
        p = PurePosixPath(loc.replace("\\", "/"))
        if p.is_absolute() or os.path.isabs(loc) or (len(loc) > 1 and loc[1] == ":"):
            raise ModelError(
                f"external data location '{loc}' is an absolute path; external data must be "
                "stored relative to the model, inside its own folder",
                file=model_path,
            )
        if ".." in p.parts:
            raise ModelError(
                f"external data location '{loc}' points outside the model's folder; "
                "move the data file next to the model and re-save it",
                file=model_path,
            )
        resolved = (base / Path(*p.parts)).resolve()
        if base != resolved and base not in resolved.parents:
            raise ModelError(
                f"external data location '{loc}' resolves outside the model's folder "
                f"(to {resolved})",
                file=model_path,
            )
        if not resolved.is_file():
            raise ModelError(
                f"external data file '{loc}' referenced by the model is missing "
                "(declare it in the 'data' attribute and keep it next to the model)",
                file=model_path,
            )
        clean.append(str(p))
    return clean


def validate_model(path: str | Path) -> dict[str, Any]:
    """Load and fully check a model file; return its info dict (see ``model_info``).

    Raises ModelError naming the file for anything unusable.
    """
    import onnx

    path = Path(path)
    proto = _load_proto_without_data(path)
    locations = check_external_locations(path, _external_locations(proto))
    try:
        onnx.checker.check_model(str(path), full_check=True)
    except Exception as e:
        text = " ".join(str(e).split()) or type(e).__name__
        if len(text) > 400:
            text = text[:400] + " ..."
        raise ModelError(f"invalid ONNX model: {text}", file=path) from None
    info = model_info(proto)
    info["external_data"] = locations
    info["model_sha256"] = sha256_file(path)
    return info


def _dtype_name(elem_type: int) -> str:
    from onnx import TensorProto, helper

    try:
        import numpy as np

        np_type = helper.tensor_dtype_to_np_dtype(elem_type)
        name = np.dtype(np_type).name
        if name in {
            "float32", "float64", "float16", "int8", "int16", "int32", "int64",
            "uint8", "uint16", "uint32", "uint64", "bool", "complex64", "complex128",
        }:
            return name
    except Exception:
        pass
    return TensorProto.DataType.Name(elem_type).lower()


def _value_info(vi) -> dict[str, Any]:
    t = vi.type
    entry: dict[str, Any] = {"name": vi.name}
    if t.HasField("tensor_type"):
        tt = t.tensor_type
        entry["dtype"] = _dtype_name(tt.elem_type) if tt.elem_type else None
        if tt.HasField("shape"):
            dims: list[int | str | None] = []
            for d in tt.shape.dim:
                if d.HasField("dim_value"):
                    dims.append(int(d.dim_value))
                elif d.HasField("dim_param"):
                    dims.append(d.dim_param)
                else:
                    dims.append(None)
            entry["shape"] = dims
        else:
            entry["shape"] = None
    else:
        entry["dtype"] = None
        entry["shape"] = None
        entry["kind"] = t.WhichOneof("value")
    return entry


def model_info(proto) -> dict[str, Any]:
    """Describe a ModelProto: IR version, opsets, real inputs (not initializers), outputs."""
    opsets = {}
    for imp in proto.opset_import:
        opsets[imp.domain or DEFAULT_DOMAIN] = int(imp.version)
    initializers = {init.name for init in proto.graph.initializer}
    inputs = [_value_info(i) for i in proto.graph.input if i.name not in initializers]
    outputs = [_value_info(o) for o in proto.graph.output]
    return {
        "ir_version": int(proto.ir_version),
        "opset": opsets.get(DEFAULT_DOMAIN),
        "opsets": dict(sorted(opsets.items())),
        "producer": proto.producer_name,
        "inputs": inputs,
        "outputs": outputs,
        "num_nodes": len(proto.graph.node),
    }


def stage_model(src: str | Path, out_model: str | Path, data_files: list[Path] | None = None,
                ) -> dict[str, Any]:
    """Validate ``src`` and copy it to ``out_model`` with its external data files placed
    next to it under the same relative names. ``data_files`` are the declared external data
    files; every location the model uses must be among them, and vice versa.

    Returns the model info with ``external_data`` listing the copied relative names.
    """
    src, out_model = Path(src), Path(out_model)
    info = validate_model(src)
    base = src.parent.resolve()
    declared = {}
    for f in data_files or []:
        f = Path(f).resolve()
        try:
            rel = f.relative_to(base).as_posix()
        except ValueError:
            raise ModelError(
                f"data file {f} is not inside the model's folder {base}", file=src
            ) from None
        declared[rel] = f
    used = set(info["external_data"])
    missing = sorted(used - set(declared))
    if missing:
        raise ModelError(
            f"the model stores tensors in {', '.join(missing)}, which is not listed in the "
            "'data' attribute; add it so it is tracked and copied with the model",
            file=src,
        )
    unused = sorted(set(declared) - used)
    if unused:
        raise ModelError(
            f"data file(s) {', '.join(unused)} are listed in 'data' but the model does not "
            "reference them",
            file=src,
        )
    out_model.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, out_model)
    for rel in sorted(used):
        dest = out_model.parent / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(declared[rel], dest)
    return info
