"""onnxruntime CPU sessions, made one way: the thread count the action was granted
(``ctx.threads``; never all cores, since parallel actions share them), sequential
execution, onnxruntime's own logging at errors only, and one clear error when the model
does not load; a model with a tensor over the allocation bound (``allocation``) is
refused before onnxruntime sees it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import OnnxError

if TYPE_CHECKING:
    from onnx import ModelProto

ERRORS = 3  # onnxruntime log severity: errors and fatal only
FATAL = 4


def session(model: str | Path | bytes | ModelProto, threads: int = 1, *, optimize: bool = True,
            optimized_path: str | Path | None = None, profile_prefix: str | None = None,
            log_severity: int = ERRORS, what: str | None = None,
            config: dict[str, str] | None = None, checked: bool = False) -> Any:
    """An ``onnxruntime.InferenceSession`` on the CPU for a ModelProto, serialized bytes or
    a path (a path keeps external data working).

    ``optimize=False`` turns graph optimisations off (tensors stay exactly the graph's);
    ``optimized_path`` saves the optimised model; ``profile_prefix`` turns profiling on;
    ``config`` sets session configuration entries (e.g. ``session.disable_prepacking``).
    Raises ``OnnxError`` ("onnxruntime cannot load WHAT: why"; WHAT defaults to the file
    name, or "the model") when onnxruntime cannot load it, and ``AllocationRefused``
    before loading a model with a tensor over the allocation bound
    (``allocation.check_model``), unless ``checked``: the caller checked this model, or
    the one it made it from by edits that change no tensor's shape (a loop of sessions
    over edited copies pays the check once).
    """
    import onnxruntime as ort

    from .allocation import check_model

    so = ort.SessionOptions()
    so.log_severity_level = log_severity
    so.intra_op_num_threads = max(1, int(threads))
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if optimized_path is not None:
        so.optimized_model_filepath = str(optimized_path)
    for key, value in (config or {}).items():
        so.add_session_config_entry(key, value)
    if profile_prefix:
        so.enable_profiling = True
        so.profile_file_prefix = profile_prefix
    if isinstance(model, (bytes, str)):
        src = model
    elif isinstance(model, Path):
        src = str(model)
    else:
        src = model.SerializeToString()
    if not checked:
        check_model(src, what=what)  # (the bytes: a parsed copy of our own to trim)
    try:
        return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])
    except Exception as e:  # onnxruntime raises several unrelated exception types
        name = what or (Path(model).name if isinstance(model, (str, Path)) else "the model")
        raise OnnxError(f"onnxruntime cannot load {name}: {short_message(e)}") from None


def short_message(e: BaseException) -> str:
    """onnxruntime's message in one line: its long source-location prefix dropped."""
    msg = str(e).strip()
    if " : " in msg:
        msg = msg.split(" : ")[-1]
    return msg.splitlines()[0][:400] if msg else type(e).__name__
