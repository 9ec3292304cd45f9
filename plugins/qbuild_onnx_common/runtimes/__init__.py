"""Target runtimes: where ``evaluate``, ``profile`` and ``auto_quantize`` run and time
models. ``onnxruntime`` (the default, and the reference the others are checked against)
and ``openvino`` (OpenVINO's CPU plugin: the optional extra ``openvino``).

``base`` (the ``Runtime`` and ``Session`` interface), ``ort_runtime`` and ``ov_runtime``
(the two implementations), ``timing`` (sessions timed interleaved, whatever their
runtime), ``presets`` (where ``auto_quantize`` places Q/DQ for each runtime). Here: the
names, ``get`` (a runtime by name), ``missing`` and ``check_runtime`` (the one line saying
what to install), ``runtime_attr`` (the rules' ``runtime`` attribute) and ``key_facts``
(what a result measured on a runtime is keyed by beyond its name).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any

from qbuild import Attr, ConfigError, attr, dist_version

from .base import Runtime

ONNXRUNTIME = "onnxruntime"
OPENVINO = "openvino"
NAMES = (ONNXRUNTIME, OPENVINO)
#: the distribution each runtime imports, and how to install it
_MODULES = {ONNXRUNTIME: "onnxruntime", OPENVINO: "openvino"}
_INSTALL = {ONNXRUNTIME: "pip install 'qbuild[onnx]'", OPENVINO: "pip install 'qbuild[openvino]'"}
_made: dict[str, Runtime] = {}


def runtime_attr(what: str) -> Attr:
    """The ``runtime`` attribute of a rule that ``what`` (e.g. "runs and times the
    models") on it."""
    return attr.enum(list(NAMES), default=ONNXRUNTIME,
                     doc=f"The runtime that {what}: onnxruntime (CPU) or openvino (CPU; "
                         f"the extra: {_INSTALL[OPENVINO]}). Its name and version key the "
                         "results (docs/runtime-targets.md).")


def get(name: str) -> Runtime:
    """The runtime called ``name`` (one instance per process)."""
    if name not in _made:
        if name == ONNXRUNTIME:
            from .ort_runtime import OnnxRuntime

            _made[name] = OnnxRuntime()
        elif name == OPENVINO:
            from .ov_runtime import OpenVino

            _made[name] = OpenVino()
        else:
            raise ValueError(f"unknown runtime '{name}' (known: {', '.join(NAMES)})")
    return _made[name]


def missing(name: str) -> str | None:
    """One line saying what to install when ``name``'s library is not importable
    (checked without importing it), else None."""
    module = _MODULES[name]
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if found:
        return None
    return f"runtime '{name}' needs {module}, which is not installed: {_INSTALL[name]}"


def key_facts(name: str) -> dict[str, str]:
    """What keys a result measured on runtime ``name`` beyond the library versions every
    ONNX rule is keyed by (onnxruntime's is one of them): the runtime's own version
    (read from its distribution's metadata, without importing it)."""
    if name == ONNXRUNTIME:
        return {}
    return {"runtime": name, name: dist_version(_MODULES[name])}


def check_runtime(attrs: Mapping[str, Any]) -> None:
    """A rule's ``validate`` step: ``ConfigError`` on the ``runtime`` attribute when the
    runtime it names is not installed (at analysis, before anything runs)."""
    problem = missing(attrs["runtime"])
    if problem:
        raise ConfigError(problem, attr="runtime")
