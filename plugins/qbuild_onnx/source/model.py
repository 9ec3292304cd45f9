"""Source ONNX models: load, validate and describe a model file, and stage it with its
external data.

Owns: the checks a model must pass before anything else touches it (a readable ONNX
protobuf, ``onnx.checker`` with ``full_check=True`` run on the *path* so models over 2 GB
and external data work, external-data locations that stay inside the model's folder), and
staging. The model "info" dict passed to dependents is
``qbuild_onnx_common.summary.model_info``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from qbuild_onnx_common.errors import OnnxError
from qbuild_onnx_common.files import sha256_file
from qbuild_onnx_common.models import load_model
from qbuild_onnx_common.models import locations as external_locations

if TYPE_CHECKING:
    from onnx import ModelProto


def _load_proto_without_data(path: Path) -> ModelProto:
    from google.protobuf.message import DecodeError

    if not path.is_file():
        raise OnnxError("model file does not exist", file=path)
    if path.stat().st_size == 0:
        raise OnnxError("model file is empty (0 bytes): not an ONNX model", file=path)
    try:
        model = load_model(path, external_data=False)
    except DecodeError as e:
        raise OnnxError(
            f"not a readable ONNX model (protobuf decode failed: {e}); "
            "the file is truncated, corrupt or not ONNX",
            file=path,
        ) from None
    except Exception as e:  # onnx raises several types for garbage input
        raise OnnxError(f"not a readable ONNX model: {e}", file=path) from None
    if model.ir_version <= 0 or not model.HasField("graph"):
        raise OnnxError(
            "not an ONNX model: no IR version or graph found (is this really an .onnx file?)",
            file=path,
        )
    return model


def check_external_locations(model_path: Path, locations: list[str]) -> list[str]:
    """Refuse external-data locations that are absolute or escape the model's folder.

    Returns the locations normalised to POSIX relative paths (what the model refers to).
    """
    base = model_path.parent.resolve()
    clean = []
    for loc in locations:
        if not loc:
            raise OnnxError("a tensor has external data with an empty location", file=model_path)
        p = PurePosixPath(loc.replace("\\", "/"))
        if p.is_absolute() or os.path.isabs(loc) or (len(loc) > 1 and loc[1] == ":"):
            raise OnnxError(
                f"external data location '{loc}' is an absolute path; external data must be "
                "stored relative to the model, inside its own folder",
                file=model_path,
            )
        if ".." in p.parts:
            raise OnnxError(
                f"external data location '{loc}' points outside the model's folder; "
                "move the data file next to the model and re-save it",
                file=model_path,
            )
        resolved = (base / Path(*p.parts)).resolve()
        if base != resolved and base not in resolved.parents:
            raise OnnxError(
                f"external data location '{loc}' resolves outside the model's folder "
                f"(to {resolved})",
                file=model_path,
            )
        if not resolved.is_file():
            raise OnnxError(
                f"external data file '{loc}' referenced by the model is missing "
                "(declare it in the 'data' attribute and keep it next to the model)",
                file=model_path,
            )
        clean.append(str(p))
    return clean


def validate_model(path: str | Path) -> dict[str, Any]:
    """Load and fully check a model file; return its info dict (see ``model_info``).

    Raises OnnxError naming the file for anything unusable.
    """
    import onnx

    path = Path(path)
    proto = _load_proto_without_data(path)
    locations = check_external_locations(path, external_locations(proto))
    try:
        if locations:
            _check_external_model(path)
        else:
            onnx.checker.check_model(str(path), full_check=True)
    except Exception as e:
        text = " ".join(str(e).split()) or type(e).__name__
        if len(text) > 400:
            text = text[:400] + " ..."
        raise OnnxError(f"invalid ONNX model: {text}", file=path) from None
    from qbuild_onnx_common.summary import model_info

    info = model_info(proto)
    info["external_data"] = locations
    info["model_sha256"] = sha256_file(path)
    return info


def _check_external_model(path: Path) -> None:
    """The full check of a model with external data: onnx's own ``full_check`` by path
    cannot read external tensors during shape inference, so a Reshape whose shape
    constant was saved externally fails it. Check the structure by path, then infer
    shapes strictly on the graph with its small tensors (shape constants) loaded and its
    weights left on disk."""
    import onnx
    from qbuild_onnx_common.models import lean_load

    onnx.checker.check_model(str(path))
    onnx.shape_inference.infer_shapes(lean_load(path), check_type=True, strict_mode=True)


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
            raise OnnxError(
                f"data file {f} is not inside the model's folder {base}", file=src
            ) from None
        declared[rel] = f
    used = set(info["external_data"])
    missing = sorted(used - set(declared))
    if missing:
        raise OnnxError(
            f"the model stores tensors in {', '.join(missing)}, which is not listed in the "
            "'data' attribute; add it so it is tracked and copied with the model",
            file=src,
        )
    unused = sorted(set(declared) - used)
    if unused:
        raise OnnxError(
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
