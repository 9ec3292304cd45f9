"""Plugin loading (pluggy, ``qbuild`` entry-point group) and the rule registry.

Built-in rules take the same path as third-party ones: our own distribution registers
``qbuild_generic`` and friends under the ``qbuild`` entry-point group.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
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


def _dist_of(pm: pluggy.PluginManager) -> dict[int, tuple[str, str]]:
    found: dict[int, tuple[str, str]] = {}
    for plugin, dist in pm.list_plugin_distinfo():
        found[id(plugin)] = (dist.project_name, dist.version)
    return found


def load_registry(extra_plugins: Iterable[ModuleType | Any] = ()) -> Registry:
    """Load entry-point plugins plus ``extra_plugins`` and collect their rules.

    Raises:
        PluginError: a plugin fails to import, returns something that is not a Rule
            subclass, or two plugins provide the same kind.
    """
    pm = pluggy.PluginManager("qbuild")
    pm.add_hookspecs(hookspecs)
    try:
        pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
    except Exception as exc:  # a broken third-party plugin must not crash with a traceback
        raise PluginError(f"cannot load a '{ENTRY_POINT_GROUP}' plugin: "
                          f"{type(exc).__name__}: {exc}") from exc
    for plugin in extra_plugins:
        if not pm.is_registered(plugin):
            pm.register(plugin)
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise PluginError(str(exc)) from exc
    dists = _dist_of(pm)
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
