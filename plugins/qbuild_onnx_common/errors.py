"""The one error type of the ONNX plugins: bad input, said in one line.

``OnnxError`` is a ``qbuild.RuleError`` (the engine adds the file and target when a rule
lets it through, and reports it without a traceback) and a ``ValueError`` (library callers
catch it as one). ``attr`` names the rule attribute the message is about, when there is
one; ``message`` is the text without the location that ``str()`` adds.
"""

from __future__ import annotations

from pathlib import Path

from qbuild import RuleError


class OnnxError(RuleError, ValueError):
    """A model, dataset, calibration or option the ONNX plugins cannot use as given."""

    def __init__(self, message: str, attr: str | None = None, *,
                 file: str | Path | None = None, target: str | None = None) -> None:
        super().__init__(message, attr=attr, file=file, target=target)
