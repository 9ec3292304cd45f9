"""Plugin loading (pluggy, ``qbuild`` entry-point group) and the rule registry.

Built-in rules take the same path as third-party ones: our own distribution registers
``qbuild_generic`` and friends under the ``qbuild`` entry-point group.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pluggy

from . import hookspecs
from ._errors import PluginError
from ._rule import Rule

ENTRY_POINT_GROUP = "qbuild"


@dataclass(frozen=True)
class RuleEntry:
    """A rule class and the distribution that provides it (part of every action key)."""

    kind: str
    cls: type[Rule]
    dist: str
    dist_version: str

    @property
    def ref(self) -> str:
        return f"{self.cls.__module__}:{self.cls.__qualname__}"


class Registry:
    """Every rule kind known to this process, with its provider."""

    def __init__(self, pm: pluggy.PluginManager, entries: dict[str, RuleEntry]) -> None:
        self.pm = pm
        self.entries = entries

    def get(self, kind: str) -> RuleEntry | None:
        return self.entries.get(kind)

    def kinds(self) -> list[str]:
        return sorted(self.entries)


def _path_fingerprint() -> list[list[Any]]:
    """Installing, upgrading or removing a distribution changes the mtime of the
    directory on sys.path that holds its metadata."""
    out = []
    for entry in sys.path:
        try:
            out.append([entry, os.stat(entry or ".").st_mtime_ns])
        except OSError:
            continue
    return out


def _entry_points(cache_file: Path | None) -> list[list[str]]:
    """``[name, value, dist, version]`` for the group, memoised in ``cache_file`` so
    that start-up does not scan every installed distribution's metadata."""
    fingerprint = _path_fingerprint()
    if cache_file is not None:
        try:
            cached = json.loads(cache_file.read_text(encoding="utf-8"))
            if cached.get("fingerprint") == fingerprint:
                return cached["entry_points"]
        except (OSError, ValueError, AttributeError):
            pass
    from importlib import metadata

    found = []
    seen = set()
    for dist in metadata.distributions():
        for ep in dist.entry_points:
            if ep.group == ENTRY_POINT_GROUP and ep.name not in seen:
                seen.add(ep.name)
                found.append([ep.name, ep.value, dist.metadata["name"], dist.version])
    if cache_file is not None:
        try:
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            temp = cache_file.with_name(f"{cache_file.name}.{os.getpid()}.tmp")
            temp.write_text(json.dumps({"fingerprint": fingerprint, "entry_points": found}),
                            encoding="utf-8")
            os.replace(temp, cache_file)
        except OSError:
            pass
    return found


def _load(value: str) -> Any:
    module_name, _, attr_path = value.partition(":")
    obj: Any = importlib.import_module(module_name.strip())
    for part in filter(None, attr_path.strip().split(".")):
        obj = getattr(obj, part)
    return obj


def load_registry(extra_plugins: Iterable[ModuleType | Any] = (),
                  cache_file: Path | None = None) -> Registry:
    """Load entry-point plugins plus ``extra_plugins`` and collect their rules.

    Raises:
        PluginError: a plugin fails to import, returns something that is not a Rule
            subclass, or two plugins provide the same kind.
    """
    pm = pluggy.PluginManager("qbuild")
    pm.add_hookspecs(hookspecs)
    # Historic: every plugin, registered before or after, may add hook specs of its own.
    pm.hook.qbuild_addhooks.call_historic(kwargs={"pluginmanager": pm})
    dists: dict[int, tuple[str, str]] = {}
    for name, value, dist_name, dist_version in _entry_points(cache_file):
        try:
            plugin = _load(value)
        except Exception as exc:  # a broken third-party plugin must not crash with a traceback
            raise PluginError(f"cannot load plugin '{name}' ({value}) from {dist_name} "
                              f"{dist_version}: {type(exc).__name__}: {exc}") from exc
        if pm.get_plugin(name) is None and not pm.is_registered(plugin):
            pm.register(plugin, name=name)
            dists[id(plugin)] = (dist_name, dist_version)
    for plugin in extra_plugins:
        if not pm.is_registered(plugin):
            pm.register(plugin)
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise PluginError(str(exc)) from exc
    entries: dict[str, RuleEntry] = {}
    for plugin in pm.get_plugins():
        impl = getattr(plugin, "qbuild_rule_types", None)
        if impl is None:
            continue
        name = pm.get_name(plugin) or repr(plugin)
        dist, version = dists.get(id(plugin), (f"local:{name}", "0"))
        rules = impl() or []
        for cls in rules:
            if not (isinstance(cls, type) and issubclass(cls, Rule) and cls.kind):
                raise PluginError(f"plugin '{name}' ({dist}) returned {cls!r} from "
                                  "qbuild_rule_types, which is not a Rule subclass with a kind")
            entry = RuleEntry(cls.kind, cls, dist, version)
            previous = entries.get(cls.kind)
            if previous is not None and previous.cls is not cls:
                raise PluginError(
                    f"rule kind '{cls.kind}' is provided twice: by {previous.dist} "
                    f"{previous.dist_version} ({previous.ref}) and by {dist} {version} "
                    f"({entry.ref}); uninstall one of them"
                )
            entries[cls.kind] = entry
    return Registry(pm, entries)
