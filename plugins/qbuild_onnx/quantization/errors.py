"""The one error type raised by the quantization code for bad input.

``QuantizeError`` is a ``ValueError`` that remembers which rule attribute (if any) the
problem belongs to, so that the rule layer can turn it into a ``qbuild.RuleError`` naming
the attribute. Nothing here imports onnx, onnxruntime or numpy.
"""

from __future__ import annotations


class QuantizeError(ValueError):
    """Bad model, calibration or options for a quantization step.

    ``attr`` names the rule attribute the message is about (``None`` when it is about
    no single attribute).
    """

    def __init__(self, message: str, attr: str | None = None) -> None:
        super().__init__(message)
        self.attr = attr
