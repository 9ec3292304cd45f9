"""onnxruntime as a target runtime: its CPU execution provider, sessions made by
``qbuild_onnx_common.ort.session`` (one way for every ONNX rule), fp32 arithmetic (the
CPU provider has no lower float precision to pick), and the reference every other
runtime's results are checked against."""

from __future__ import annotations

from qbuild import dist_version

from ..models import ModelSource
from .base import DEFAULT, FP32, FloatForm, Session

NAME = "onnxruntime"


class OnnxRuntime:
    """The ``Runtime`` of onnxruntime's CPU provider."""

    name = NAME

    def version(self) -> str:
        return dist_version("onnxruntime")

    def load(self, model: ModelSource, threads: int = 1, precision: str = DEFAULT,
             what: str | None = None) -> Session:
        from ..ort import session

        s: Session = session(model, threads, what=what)
        return s

    def float_forms(self) -> list[FloatForm]:
        return [FloatForm(FP32, FP32)]

    def facts(self) -> dict[str, str]:
        return {"default_precision": FP32}
