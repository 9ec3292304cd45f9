"""``OnnxRule``: the base class of every rule of the ONNX plugins.

It says what the rules need installed (the "onnx" extra), which library versions key
their outputs, and that this package's source keys their actions: ``code()`` names
``qbuild_onnx_common``, so editing a helper here reruns every action that may use it
(subclasses that name more code extend ``super().code(attrs)``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from qbuild import Rule, dist_version

ONNX_LIBS = ("onnx", "onnxruntime", "numpy")
ONNX_INSTALL = "pip install 'qbuild[onnx]'"
SHARED_CODE = __name__.split(".", 1)[0]


class OnnxRule(Rule):
    """A rule that needs onnx, onnxruntime and numpy (imported inside ``run`` only)."""

    requires: ClassVar[Sequence[str]] = ONNX_LIBS
    install_hint = ONNX_INSTALL
    #: Distributions beyond onnx, onnxruntime and numpy whose versions change the outputs.
    env_libs: ClassVar[tuple[str, ...]] = ()

    def env(self) -> dict[str, str]:
        return {lib: dist_version(lib) for lib in (*ONNX_LIBS, *self.env_libs)}

    def code(self, attrs: Mapping[str, Any]) -> list[str]:
        return [SHARED_CODE]
