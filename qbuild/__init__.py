"""qbuild: a Bazel-style, content-addressed build system for ONNX model artifacts.

The public API for plugin authors is what this module exports (``__all__``): the
``Rule`` base class, the ``attr`` schema constructors, typed providers (``Provider``,
``DefaultInfo``), ``AnalysisContext`` and ``RunContext`` (rule API v2: analysis declares
actions), ``Dep`` and ``ActionContext`` (v1 ``run``),
the ``hookimpl`` marker, the errors, ``dist_version`` for environment facts,
``output_folder`` (where a label's outputs live) and ``forward_files`` (an action
function giving its input files as its outputs, run without a sandbox).
Everything in underscore modules is internal. See ``qbuild.hookspecs`` for the hooks and
``qbuild.testing`` for the test helpers.
"""

from __future__ import annotations

import pluggy

from ._actions import AnalysisContext, RunContext, forward_files
from ._attrs import Attr, attr
from ._errors import BuildFailed, ConfigError, PluginError, QbuildError, RuleError, UsageError
from ._label import output_folder
from ._providers import DefaultInfo, Provider
from ._rule import ActionContext, Dep, Rule

__version__ = "0.1.0"

hookimpl = pluggy.HookimplMarker("qbuild")
"""Decorator for hook implementations in a plugin module (``@qbuild.hookimpl``)."""

_versions: dict[str, str] = {}


def dist_version(distribution: str) -> str:
    """The installed version of a distribution ("absent" if not installed), without
    importing it: for ``Rule.env()`` facts such as the onnxruntime version."""
    version = _versions.get(distribution)
    if version is None:
        from importlib import metadata

        try:
            version = metadata.version(distribution)
        except metadata.PackageNotFoundError:
            version = "absent"
        _versions[distribution] = version
    return version


__all__ = [
    "ActionContext",
    "AnalysisContext",
    "Attr",
    "BuildFailed",
    "ConfigError",
    "DefaultInfo",
    "Dep",
    "PluginError",
    "Provider",
    "QbuildError",
    "Rule",
    "RuleError",
    "RunContext",
    "UsageError",
    "__version__",
    "attr",
    "dist_version",
    "forward_files",
    "hookimpl",
    "output_folder",
]
