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


def exception_reason(exc: BaseException) -> str:
    """An exception as one line a user can act on: ``Type: message``; for one without
    a message (a bare ``assert`` in onnxruntime's tools or a user's metric), where it was
    raised and the line: ``AssertionError at onnxruntime/tools/x.py:12 (assert a == b)``,
    never the bare type name."""
    import traceback

    name = type(exc).__name__
    text = " ".join(str(exc).split())
    if text:
        return f"{name}: {text}"
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return f"{name} (raised without a message)"
    frame = frames[-1]
    parts = Path(frame.filename).parts
    # installed packages by their import path, other files by name alone: a sandbox's
    # folder in the reason would change it on every run (and a reason is in the key of
    # a target that tolerates the failure)
    where = ("/".join(parts[parts.index("site-packages") + 1:]) if "site-packages" in parts
             else parts[-1])
    line = f" ({frame.line.strip()})" if frame.line else ""
    return f"{name} at {where}:{frame.lineno}{line}"
