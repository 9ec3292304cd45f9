"""``qbuild info``: the facts in force for this workspace, on one screen.

The toolchain (pinned and installed versions of what changes artifacts), the Python and
platform, the machine class that machine-dependent rules are keyed by, the workspace, the
cache folder and its size, and every loaded plugin with its distribution, version and
where it was loaded from.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Iterator
from pathlib import Path

from ..analysis.plugins import Registry
from ..analysis.workspace import Workspace
from ..build.progress import human_size
from ..core.versions import __version__, dist_version
from ..keys.machine import machine_facts
from ..keys.toolchain import matches

# Distributions whose versions change ONNX artifacts (always shown).
TOOLCHAIN = ("onnx", "onnxruntime", "numpy", "sympy", "ml_dtypes", "protobuf", "Pillow")


def folder_size(path: Path) -> tuple[int, int]:
    """(bytes, files) under ``path`` (0, 0 if it does not exist)."""
    total = files = 0
    for dirpath, _dirs, names in os.walk(path):
        for name in names:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
                files += 1
            except OSError:
                pass
    return total, files


def info_lines(workspace: Workspace, registry: Registry) -> Iterator[str]:
    yield f"qbuild {__version__} ({Path(__file__).resolve().parent})"
    yield f"python {platform.python_version()} ({sys.executable})"
    yield f"platform {platform.system()} {platform.release()} {platform.machine()}"
    yield "machine class (keys of machine-dependent rules): " + ", ".join(
        f"{k.removeprefix('machine.')}={v}" for k, v in machine_facts().items())
    yield f"workspace {workspace.root}"
    yield f"output folder {workspace.output_dir}"
    size, files = folder_size(workspace.cache_dir)
    where = "QBUILD_CACHE_DIR" if os.environ.get("QBUILD_CACHE_DIR") else "qbuild.toml or default"
    yield (f"cache {workspace.cache_dir} ({human_size(size)} in {files} files; from {where}; "
           "shared by every workspace that uses it)")
    pins = dict(workspace.toolchain)
    yield "toolchain:"
    for dist in sorted({*TOOLCHAIN, *pins}, key=str.lower):
        installed = dist_version(dist)
        pin = pins.get(dist)
        state = ""
        if pin is not None:
            state = (f"  (pinned {pin}: ok)" if matches(installed, pin)
                     else f"  (pinned {pin}: MISMATCH)")
        yield f"  {dist} {installed}{state}"
    yield "plugins:"
    by_dist: dict[tuple[str, str], dict[str, list[str]]] = {}
    for kind in registry.kinds():
        entry = registry.entries[kind]
        module = sys.modules.get(entry.cls.__module__)
        origin = getattr(module, "__file__", None) or entry.cls.__module__
        by_dist.setdefault((entry.dist, entry.dist_version), {}).setdefault(
            str(Path(origin).parent) if os.path.sep in str(origin) else origin, []).append(kind)
    for (dist, version), places in sorted(by_dist.items()):
        for place, kinds in sorted(places.items()):
            missing = sorted({d for k in kinds for d in registry.entries[k].cls
                              .missing_requirements()})
            note = f"  [missing: {', '.join(missing)}]" if missing else ""
            yield f"  {dist} {version} from {place}: {', '.join(kinds)}{note}"


def plugin_lines(registry: Registry) -> Iterator[str]:
    """``qbuild info --plugins``: every plugin with its distribution, version, module
    file, the rules it provides and the hooks it implements; blocked ones say so."""
    for plugin in registry.plugins:
        if plugin.blocked:
            yield (f"{plugin.name}: {plugin.dist} {plugin.version} ({plugin.module}) "
                   f"blocked (-p no:{plugin.name})")
            continue
        loaded = registry.pm.get_plugin(plugin.name)
        hooks = sorted(caller.name for caller in registry.pm.get_hookcallers(loaded) or []
                       ) if loaded is not None else []
        provided = [kind for kind in registry.kinds()
                    if registry.entries[kind].plugin == plugin.name]
        yield f"{plugin.name}: {plugin.dist} {plugin.version} from {plugin.path}"
        if provided:
            yield f"  rules: {', '.join(provided)}"
        if hooks:
            yield f"  hooks: {', '.join(hooks)}"
