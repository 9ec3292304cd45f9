"""qbuild: a Bazel-style, content-addressed build system for ONNX model artifacts.

The public API for plugin authors is what this module exports (``__all__``): the
``Rule`` base class, the ``attr`` schema constructors, typed providers (``Provider``,
``DefaultInfo``), ``AnalysisContext`` and ``RunContext`` (rule API v2: analysis declares
actions), ``Dep`` and ``ActionContext`` (v1 ``run``),
the ``hookimpl`` marker, the errors, ``dist_version`` for environment facts,
``fact_generation`` (what a plugin's memo of key facts is keyed on),
``output_folder`` (where a label's outputs live) and ``forward_files`` (an action
function giving its input files as its outputs, run without a sandbox).
Everything in underscore modules is internal. See ``qbuild.hookspecs`` for the hooks and
``qbuild.testing`` for the test helpers.
"""

from __future__ import annotations

import pluggy

from .api.actions import AnalysisContext, RunContext, forward_files
from .api.attrs import Attr, attr
from .api.providers import DefaultInfo, Provider
from .api.rule import ActionContext, Dep, Rule
from .core.errors import BuildFailed, ConfigError, PluginError, QbuildError, RuleError, UsageError
from .core.generation import fact_generation
from .core.labels import output_folder
from .core.versions import __version__, dist_version

hookimpl = pluggy.HookimplMarker("qbuild")
"""Decorator for hook implementations in a plugin module (``@qbuild.hookimpl``)."""


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
    "fact_generation",
    "forward_files",
    "hookimpl",
    "output_folder",
]
