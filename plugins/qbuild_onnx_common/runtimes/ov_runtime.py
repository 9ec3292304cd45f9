"""OpenVINO as a target runtime (the optional extra ``openvino``; imported only when a
model is loaded, with one line naming the extra when it is missing).

Models are read by OpenVINO's ONNX front end from their file (a model given in memory
is written to a scratch file first; OpenVINO's telemetry is used only by its conversion
tool, never here) and compiled for the CPU with ``threads`` inference threads, one
stream and the latency hint; no compiled-model cache is kept. With one thread OpenVINO
computes on the calling thread, so the calling thread's CPU time is a run's whole cost,
as with onnxruntime.

Precision: OpenVINO's CPU plugin computes float layers in bf16 by default on CPUs that
have it (its ``INFERENCE_PRECISION_HINT``), so "fp32" on such a CPU means asking for it
(``precision = FP32``); ``float_forms`` reports both when they differ. Dynamic input
dimensions are fixed to each feed's shapes before compiling (OpenVINO's CPU kernels for
static shapes are its fast ones; a deployment reshapes the same way), one compiled model
per distinct shape.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qbuild import dist_version

from ..errors import OnnxError
from ..models import ModelSource
from .base import DEFAULT, FP32, FloatForm

NAME = "openvino"
INSTALL = "pip install 'qbuild[openvino]'"
#: OpenVINO's element type names -> the names reports use
_PRECISIONS = {"f32": "fp32", "bf16": "bf16", "f16": "fp16"}
#: the precision suffix of OpenVINO's kernel names ("brgconv_avx512_I8") as reported
_KERNEL_PRECISIONS = {"F32": "FP32", "FP32": "FP32", "I8": "I8", "U8": "U8", "BF16": "BF16",
                      "F16": "FP16", "FP16": "FP16", "I32": "I32"}


def require() -> Any:
    """The ``openvino`` module, or ``OnnxError`` naming the extra to install."""
    try:
        import openvino
    except ImportError:
        raise OnnxError(f"runtime 'openvino' needs OpenVINO, which is not installed: "
                        f"{INSTALL}", attr="runtime") from None
    return openvino


def short_message(e: BaseException) -> str:
    """OpenVINO's message in one line: the last line that says something (its messages
    are stacks of 'Exception from src/...' locations)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    said = [ln for ln in lines if not ln.startswith(("Exception from ", "Check '"))]
    return (said[-1] if said else lines[-1] if lines else type(e).__name__)[:400]


@dataclass(frozen=True)
class _Port:
    name: str


class OpenVinoSession:
    """A model compiled by OpenVINO, with onnxruntime's session interface."""

    def __init__(self, core: Any, model: Any, config: Mapping[str, Any], what: str,
                 names: tuple[list[str], list[str]]) -> None:
        self._core = core
        self._model = model
        self._config = dict(config)
        self._what = what
        # the ONNX graph's own names: OpenVINO gives a tensor every name it had, in no
        # set order
        self._inputs = [_Port(n) for n in names[0]]
        self._outputs = [_Port(n) for n in names[1]]
        self._static = all(p.get_partial_shape().is_static for p in model.inputs)
        self._compiled: dict[tuple[tuple[int, ...], ...], Any] = {}
        self._last: Any = None

    def get_inputs(self) -> Sequence[_Port]:
        return self._inputs

    def get_outputs(self) -> Sequence[_Port]:
        return self._outputs

    def precision(self) -> str:
        """The float precision OpenVINO computes this model's float layers in."""
        request = next(iter(self._compiled.values()), None) or self._compile(None)
        return _name(request.get_compiled_model().get_property("INFERENCE_PRECISION_HINT"))

    def _compile(self, shapes: tuple[tuple[int, ...], ...] | None) -> Any:
        model = self._model
        try:
            if shapes is not None:
                model = model.clone()
                model.reshape({p.name: list(s) for p, s in zip(self._inputs, shapes,
                                                                strict=True)})
            compiled = self._core.compile_model(model, "CPU", self._config)
        except Exception as e:  # OpenVINO raises RuntimeError, TypeError, ...
            raise OnnxError(f"openvino cannot compile {self._what}: {short_message(e)}"
                            ) from None
        return compiled.create_infer_request()

    def _request(self, feed: Mapping[str, Any]) -> Any:
        shapes = None if self._static else tuple(tuple(feed[p.name].shape)
                                                 for p in self._inputs)
        key = shapes or ()
        request = self._compiled.get(key)
        if request is None:
            request = self._compiled[key] = self._compile(shapes)
        return request

    def node_times(self) -> dict[str, tuple[str, float]]:
        """The last run's performance counters (the model loaded with ``perf_counts``):
        {node: ("<node type> <kernel precision>", ms)} of the nodes that ran."""
        out: dict[str, tuple[str, float]] = {}
        for p in self._last.profiling_info if self._last is not None else ():
            if str(p.status).endswith("EXECUTED"):
                precision = _KERNEL_PRECISIONS.get(p.exec_type.rsplit("_", 1)[-1].upper(), "")
                kind = f"{p.node_type} {precision}".strip()
                out[p.node_name] = (kind, p.real_time.total_seconds() * 1000.0)
        return out

    def run(self, output_names: Sequence[str] | None, feed: Mapping[str, Any]) -> list[Any]:
        request = self._last = self._request(feed)
        names = [p.name for p in self._outputs] if output_names is None else output_names
        try:
            request.infer(dict(feed))
            return [request.get_tensor(n).data.copy() for n in names]
        except Exception as e:
            raise OnnxError(f"openvino cannot run {self._what}: {short_message(e)}") from None


def _graph_names(path: Path) -> tuple[list[str], list[str]]:
    """The model's graph inputs (initializers excepted) and outputs, in its order."""
    from ..models import load_model

    graph = load_model(path, external_data=False).graph
    weights = {t.name for t in graph.initializer}
    return ([v.name for v in graph.input if v.name not in weights],
            [v.name for v in graph.output])


def _name(element_type: Any) -> str:
    text = element_type.get_type_name() if hasattr(element_type, "get_type_name") \
        else str(element_type)
    return _PRECISIONS.get(text, text)


class OpenVino:
    """The ``Runtime`` of OpenVINO's CPU plugin."""

    name = NAME

    def __init__(self) -> None:
        self._core: Any = None

    def core(self) -> Any:
        if self._core is None:
            self._core = require().Core()
        return self._core

    def version(self) -> str:
        return dist_version("openvino")

    def default_precision(self) -> str:
        """The precision OpenVINO's CPU plugin computes float layers in on this CPU."""
        return _name(self.core().get_property("CPU", "INFERENCE_PRECISION_HINT"))

    def load(self, model: ModelSource, threads: int = 1, precision: str = DEFAULT,
             what: str | None = None, perf_counts: bool = False) -> OpenVinoSession:
        """(``Runtime.load``) With ``perf_counts``, OpenVINO times every node of every
        run (``OpenVinoSession.node_times``)."""
        core = self.core()
        config: dict[str, Any] = {"INFERENCE_NUM_THREADS": max(1, int(threads)),
                                  "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY"}
        if precision != DEFAULT:  # FP32, or a precision by name ("bf16", "fp16")
            hint = {v: k for k, v in _PRECISIONS.items()}.get(precision)
            if hint is None:
                raise OnnxError(f"openvino has no float precision '{precision}' (known: "
                                f"{', '.join(_PRECISIONS.values())})")
            config["INFERENCE_PRECISION_HINT"] = hint
        if perf_counts:
            config["PERF_COUNT"] = True
        name = what or (Path(model).name if isinstance(model, (str, Path)) else "the model")
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(model) if isinstance(model, (str, Path)) else Path(tmp) / "model.onnx"
            if not isinstance(model, (str, Path)):
                path.write_bytes(model.SerializeToString())
            try:  # by the ONNX front end: Core.read_model tries every front end it has
                front = require().frontend.FrontEndManager().load_by_framework("onnx")
                read = front.convert(front.load(str(path)))
            except Exception as e:
                raise OnnxError(f"openvino cannot load {name}: {short_message(e)}") from None
            names = _graph_names(path)
        return OpenVinoSession(core, read, config, name, names)

    def float_forms(self) -> list[FloatForm]:
        forms = [FloatForm(FP32, FP32)]
        default = self.default_precision()
        if default != FP32:
            forms.append(FloatForm(default, DEFAULT))
        return forms

    def facts(self) -> dict[str, str]:
        core = self.core()
        return {"default_precision": self.default_precision(),
                "device": str(core.get_property("CPU", "FULL_DEVICE_NAME")),
                "capabilities": " ".join(core.get_property("CPU",
                                                           "OPTIMIZATION_CAPABILITIES"))}
