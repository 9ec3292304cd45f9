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
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pluggy

from .. import hookspecs
from ..api.rule import Rule
from ..core.errors import PluginError

ENTRY_POINT_GROUP = "qbuild"


@dataclass(frozen=True)
class RuleEntry:
    """A rule class and the distribution that provides it (part of every action key)."""

    kind: str
    cls: type[Rule]
    dist: str
    dist_version: str
    plugin: str = field(default="", compare=False)  # the plugin that returned it

    @property
    def ref(self) -> str:
        return f"{self.cls.__module__}:{self.cls.__qualname__}"


@dataclass(frozen=True)
class PluginInfo:
    """A loaded plugin: its name, where it came from, and its module's file."""

    name: str
    dist: str
    version: str
    module: str
    path: str
    blocked: bool = False


class Registry:
    """Every rule kind known to this process, with its provider, and the plugins."""

    def __init__(self, pm: pluggy.PluginManager, entries: dict[str, RuleEntry],
                 plugins: list[PluginInfo] | None = None) -> None:
        self.pm = pm
        self.entries = entries
        self.plugins = list(plugins or [])
        self._hooks: dict[str, list[tuple[str, str]]] = {}

    def get(self, kind: str) -> RuleEntry | None:
        return self.entries.get(kind)

    def kinds(self) -> list[str]:
        return sorted(self.entries)

    def expander(self, kind: str) -> Any:
        """The ``expand_targets`` of the rule ``kind`` if it is a macro, else None (what
        the package loader asks of each target it loads)."""
        entry = self.entries.get(kind)
        return getattr(entry.cls, "expand_targets", None) if entry is not None else None

    def hook_plugins(self, target: Any) -> dict[str, list[tuple[str, str]]]:
        """The plugins implementing each hook ``target``'s rule calls (its ``code()``
        names them ``hook:<name>``), resolved here in the main process once per hook:
        hook name -> [(importable module, "distribution version")]. Part of the key,
        and what the action's ``ctx.hooks`` calls in whatever process runs it."""
        refs = target.rule.code(target.attrs) or [] if target.rule is not None else []
        out: dict[str, list[tuple[str, str]]] = {}
        for ref in refs:
            if ref.startswith("hook:"):
                name = ref[5:]
                if name not in self._hooks:
                    self._hooks[name] = self._resolve_hook(name)
                out[name] = self._hooks[name]
        return out

    def _resolve_hook(self, name: str) -> list[tuple[str, str]]:
        caller = getattr(self.pm.hook, name, None)
        by_module = {p.module: f"{p.dist} {p.version}" for p in self.plugins}
        found = []
        for impl in caller.get_hookimpls() if caller is not None else ():
            plugin = impl.plugin
            module = (plugin.__name__ if isinstance(plugin, ModuleType)
                      else type(plugin).__module__)
            found.append((module, by_module.get(module, f"local:{module} 0")))
        return found


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
                found: list[list[str]] = cached["entry_points"]
                return found
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


def _origin(plugin: Any) -> tuple[str, str]:
    """(module name, file) of a plugin object."""
    module = plugin.__name__ if isinstance(plugin, ModuleType) else type(plugin).__module__
    loaded = sys.modules.get(module)
    return module, str(getattr(loaded, "__file__", None) or module)


def load_registry(extra_plugins: Iterable[ModuleType | Any] = (),
                  cache_file: Path | None = None, blocked: Iterable[str] = ()) -> Registry:
    """Load entry-point plugins plus ``extra_plugins`` and collect their rules.
    Plugins named in ``blocked`` (``-p no:NAME``: an entry-point name, or the module
    name of an extra plugin) are not loaded at all.

    Raises:
        PluginError: a plugin fails to import, returns something that is not a Rule
            subclass, or two plugins provide the same kind.
    """
    pm = pluggy.PluginManager("qbuild")
    pm.add_hookspecs(hookspecs)
    # Historic: every plugin, registered before or after, may add hook specs of its own.
    pm.hook.qbuild_addhooks.call_historic(kwargs={"pluginmanager": pm})
    blocked = set(blocked)
    for name in blocked:
        pm.set_blocked(name)
    dists: dict[int, tuple[str, str]] = {}
    infos: list[PluginInfo] = []
    for name, value, dist_name, dist_version in _entry_points(cache_file):
        if name in blocked:
            infos.append(PluginInfo(name, dist_name, dist_version, value.partition(":")[0],
                                    "", blocked=True))
            continue
        try:
            plugin = _load(value)
        except Exception as exc:  # a broken third-party plugin must not crash with a traceback
            raise PluginError(f"cannot load plugin '{name}' ({value}) from {dist_name} "
                              f"{dist_version}: {type(exc).__name__}: {exc}") from exc
        if pm.get_plugin(name) is None and not pm.is_registered(plugin):
            pm.register(plugin, name=name)
            dists[id(plugin)] = (dist_name, dist_version)
            infos.append(PluginInfo(name, dist_name, dist_version, *_origin(plugin)))
    for plugin in extra_plugins:
        module, path = _origin(plugin)
        if module in blocked or module.rpartition(".")[2] in blocked:
            continue
        if not pm.is_registered(plugin):
            pm.register(plugin)
            infos.append(PluginInfo(pm.get_name(plugin) or module, f"local:{module}", "0",
                                    module, path))
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
            entry = RuleEntry(cls.kind, cls, dist, version, name)
            previous = entries.get(cls.kind)
            if previous is not None and previous.cls is not cls:
                raise PluginError(
                    f"rule kind '{cls.kind}' is provided twice: by {previous.dist} "
                    f"{previous.dist_version} ({previous.ref}) and by {dist} {version} "
                    f"({entry.ref}); uninstall one of them"
                )
            entries[cls.kind] = entry
    return Registry(pm, entries, infos)
