"""Hook specifications this plugin adds to qbuild's plugin manager.

A plugin adds dtype targets by implementing::

    from qbuild import hookimpl
    from qbuild_dtypes.runtime.targets import DtypeTarget

    @hookimpl
    def qbuild_dtype_targets():
        return [DtypeTarget(name="my-npu", max_opset={"": 21}, max_ir=10, ...)]
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from .runtime.targets import TargetDefinition

hookspec = pluggy.HookspecMarker("qbuild")


@hookspec
def qbuild_dtype_targets() -> list[TargetDefinition]:  # type: ignore[empty-body]
    """Return a list of :class:`qbuild_dtypes.runtime.targets.DtypeTarget` objects (or dicts
    with the same fields) that ``qdq_retarget`` / ``requantize_weights`` accept as
    ``target``."""
