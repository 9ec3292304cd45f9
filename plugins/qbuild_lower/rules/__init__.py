"""The rules of ``qbuild_lower`` (the entry point ``lower = "qbuild_lower.rules"`` loads
this module): ``lower_integer``, ``fuse_lut`` and ``profile``, rule API v2, one module
each. Each declares its actions at analysis; the actions are thin wrappers over
``lowering``, ``patterns.fuse``, ``checking`` and ``profiling``. ``inputs`` holds what the
actions share: model files, the dataset folder, feeds.

Imports only qbuild and the shared providers at module level; onnx, onnxruntime and numpy
load inside the actions.
"""

from __future__ import annotations

from qbuild import Rule, hookimpl

from .fuse_lut import FuseLut
from .lower_integer import LowerInteger
from .profile import Profile

__all__ = ["FuseLut", "LowerInteger", "Profile", "qbuild_rule_types"]


@hookimpl
def qbuild_rule_types() -> list[type[Rule]]:
    return [LowerInteger, FuseLut, Profile]
