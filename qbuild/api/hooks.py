"""Plugin-defined hooks as an action calls them: ``ctx.hooks.<name>(...)``.

Which plugins implement a hook is decided once, in the main process during analysis
(``Registry.hook_plugins``: the plugins registered there, entry points and
``qbuild.testing.Workspace.register`` alike, minus blocked ones), and that list is both
part of the action key and carried by the ``TargetActions`` record. Whatever process runs
the action calls exactly those implementations: it imports their modules and
registers them in a plugin manager of its own (pluggy, so hook options such as
``tryfirst`` and opt-in arguments behave as in the main process).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

import pluggy


class ResolvedHooks:
    """Attribute access to the hooks an action declared (``hook:<name>`` in its rule's
    ``code()``); calling an undeclared hook is an error, not a silent empty answer."""

    def __init__(self, hooks: Mapping[str, tuple[str, ...]]) -> None:
        self._hooks = dict(hooks)
        self._pm: pluggy.PluginManager | None = None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in self._hooks:
            raise AttributeError(f"hook {name!r} was not declared by the rule: return "
                                 f"'hook:{name}' from Rule.code() so its implementations "
                                 "are resolved and keyed")
        caller = getattr(self.pluginmanager.hook, name, None)
        if caller is None:  # no plugin implements it: pluggy's answer, an empty list
            return lambda **_kwargs: []
        return caller

    @property
    def pluginmanager(self) -> pluggy.PluginManager:
        """A plugin manager holding exactly the resolved implementations."""
        if self._pm is None:
            pm = pluggy.PluginManager("qbuild")
            for module in sorted({m for mods in self._hooks.values() for m in mods}):
                plugin = importlib.import_module(module)
                if not pm.is_registered(plugin):
                    pm.register(plugin, name=module)
            self._pm = pm
        return self._pm
