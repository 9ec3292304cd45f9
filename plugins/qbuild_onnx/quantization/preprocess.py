"""Quantization pre-processing: onnxruntime's ``quant_pre_process`` as one cached step.

Owns running symbolic shape inference, ORT graph optimisation and ONNX shape inference
(each skippable) on a model, writing the result deterministically, and describing it.
ORT's output was checked byte-identical across runs and processes (onnxruntime 1.31.1,
MNIST / MobileNetV2 / YOLOX-Nano / Silero VAD); ``normalise_model_file`` still rewrites
the one field that could carry per-run state (temporary external-data names), and the
rule's tests compare the bytes of two runs. Nodes left unnamed are given stable names
(``joins.name_nodes``), since exclusions, regions and sensitivity address nodes by name.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from qbuild_onnx_common.allocation import check_model
from qbuild_onnx_common.errors import OnnxError, exception_reason
from qbuild_onnx_common.files import sha256_file
from qbuild_onnx_common.models import load_model, uses_external_data
from qbuild_onnx_common.summary import model_info

from ..source.model_checks import describe_quantized, drop_initializer_inputs, initializer_inputs
from .joins import name_nodes
from .options import PreprocessOptions


def preprocess_model(src: str | Path, out: str | Path, opts: PreprocessOptions | None = None,
                     external_data: bool = False, log: Callable[[str], None] | None = None
                     ) -> dict[str, Any]:
    """Pre-process ``src`` into ``out``; return the output model's info.

    With ``external_data`` the weights go to ``<out name>.data`` next to ``out`` (needed
    for models over 2 GB). ORT's console chatter is captured and sent to ``log``.
    """
    import onnx
    from onnxruntime.quantization.shape_inference import quant_pre_process

    opts = opts or PreprocessOptions()
    src, out = Path(src), Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    data_name = out.name + ".data"
    kwargs = asdict(opts)
    if external_data:
        kwargs.update(save_as_external_data=True, all_tensors_to_one_file=True,
                      external_data_location=data_name, external_data_size_threshold=1024)
    notes = []
    proto = load_model(src, external_data=False)
    refusal = describe_quantized(proto, "quantization pre-processing")
    if refusal:
        raise OnnxError(refusal, file=src)
    # onnxruntime's symbolic shape inference computes int64 constants (a ConstantOfShape
    # of a declared shape) with numpy: a tensor over the bound is refused first
    check_model(src)
    fixed = None
    if initializer_inputs(proto) and not uses_external_data(proto):
        count = drop_initializer_inputs(proto)
        fixed = out.parent / f".{out.name}.inputs-fixed.onnx"
        onnx.save(proto, str(fixed))
        src_for_ort = fixed
        notes.append(f"{count} initializers were also listed as graph inputs; they are "
                     "treated as constants (so BatchNormalization folds and per-channel "
                     "axes are known)")
        if log is not None:
            log(notes[-1])
    else:
        src_for_ort = src
    # external weights stay on disk (models over 2 GB): algorithms.preprocess_external
    lean = external_data and fixed is None and uses_external_data(proto)
    del proto
    chatter = io.StringIO()
    try:
        with contextlib.redirect_stdout(chatter), contextlib.redirect_stderr(chatter):
            if lean:
                from ..algorithms.preprocess_external import quant_pre_process_external

                quant_pre_process_external(src_for_ort, out, opts, data_name)
            else:
                quant_pre_process(str(src_for_ort), str(out), **kwargs)
    except Exception as e:
        text = exception_reason(e)[:500]
        hint = ""
        if "2GB" in text or "2 GB" in text or "exceeds" in text.lower():
            hint = " (for models over 2 GB set external_data = true)"
        raise OnnxError(f"quantization pre-processing failed: {text}{hint}",
                         file=src) from None
    finally:
        if fixed is not None:
            fixed.unlink(missing_ok=True)
        if log is not None and chatter.getvalue().strip():
            for line in chatter.getvalue().splitlines():
                log(line)
    if external_data and not (out.parent / data_name).exists():
        # ORT writes no data file when no tensor crossed the size threshold; keep the
        # declared output set stable.
        (out.parent / data_name).write_bytes(b"")
    normalise_model_file(out)
    proto = load_model(out, external_data=False)
    named = name_nodes(proto)
    if named:
        # exclusions, regions and sensitivity address nodes by name; onnxruntime keeps
        # a source's unnamed nodes unnamed (UltraFace: 62 of them)
        onnx.save(proto, str(out))
        notes.append(f"{named} unnamed node(s) were given names (op type and first output)")
        if log is not None:
            log(notes[-1])
    info = model_info(proto)
    # Which node names the rewrite removed, so that a later "no node named X" can say why.
    from onnxruntime import __version__ as ort_version

    from .selectors import rewrites_between

    info["preprocess_rewrites"] = rewrites_between(
        load_model(src, external_data=False), proto,
        f"onnxruntime {ort_version}'s quant_pre_process")
    info["external_data"] = [data_name] if external_data else []
    info["model_sha256"] = sha256_file(out)
    info["preprocess"] = asdict(opts)
    if notes:
        info["notes"] = notes
    return info


def normalise_model_file(path: Path) -> None:
    """Make sure no absolute or temporary path leaks into the saved model.

    ORT may save through a temporary directory; an external-data ``location`` must then
    be the plain relative file name. Rewrites the file only if something changed.
    """
    import onnx
    from onnx import external_data_helper

    proto = load_model(path, external_data=False)
    changed = False
    for tensor in external_data_helper._get_all_tensors(proto):
        if not external_data_helper.uses_external_data(tensor):
            continue
        for entry in tensor.external_data:
            if entry.key == "location":
                base = os.path.basename(entry.value.replace("\\", "/"))
                if base != entry.value:
                    entry.value = base
                    changed = True
    if changed:
        onnx.save(proto, str(path))
