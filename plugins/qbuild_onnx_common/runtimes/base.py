"""What every target runtime offers: load a model into a ``Session`` on the CPU with a
thread count and a float precision, run feeds through it, and name itself and its
version (which key every result measured on it).

A ``Session`` is the subset of onnxruntime's ``InferenceSession`` the ONNX plugins use:
``run(output_names, feed)`` returning arrays in the order asked (every graph output, in
the model's order, for ``None``), ``get_inputs()`` and ``get_outputs()`` (objects with a
``name``). onnxruntime's own session is one; other runtimes wrap theirs to match, so the
metrics, tasks and timing code run on any of them unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..models import ModelSource

#: the float forms a report names: fp32, and the runtime's own default where it differs
FP32 = "fp32"
DEFAULT = "default"


class Port(Protocol):
    """An input or output of a session: its tensor name."""

    @property
    def name(self) -> str: ...


class Session(Protocol):
    """A loaded model (see the module docstring)."""

    def run(self, output_names: Sequence[str] | None, feed: Mapping[str, Any]) -> list[Any]: ...

    def get_inputs(self) -> Sequence[Port]: ...

    def get_outputs(self) -> Sequence[Port]: ...


@dataclass(frozen=True)
class FloatForm:
    """One way a runtime computes a float model: ``precision`` as ``load`` takes it
    (``FP32`` or ``DEFAULT``) and ``name`` as reports show it ("fp32", "bf16", ...)."""

    name: str
    precision: str


class Runtime(Protocol):
    """A target runtime: ``name`` (as the ``runtime`` attribute spells it)."""

    name: str

    def version(self) -> str:
        """The installed version (from the distribution's metadata)."""
        ...

    def load(self, model: ModelSource, threads: int = 1, precision: str = DEFAULT,
             what: str | None = None) -> Session:
        """``model`` loaded for ``threads`` threads; ``precision`` ``FP32`` forces fp32
        arithmetic where the runtime would pick a lower one, ``DEFAULT`` keeps its
        choice, a name ("bf16") asks for that one where the runtime has it. Raises
        ``OnnxError`` naming ``what`` (or the file) when it cannot."""
        ...

    def float_forms(self) -> list[FloatForm]:
        """The forms a float model is timed in: fp32 first, then the runtime's default
        precision on this CPU when it is not fp32 (e.g. bf16)."""
        ...

    def facts(self) -> dict[str, str]:
        """What this runtime reports about the CPU that changes its results (e.g. the
        default inference precision), for reports."""
        ...
