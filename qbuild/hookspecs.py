"""The hook specifications plugins implement: qbuild's whole plugin contract.

Every hook is prefixed ``qbuild_``. Implement them as module-level functions decorated
with ``qbuild.hookimpl`` in the module your ``qbuild`` entry point names. A hook
implementation may take fewer arguments than the spec (pluggy's opt-in arguments), so
new arguments can be added later without breaking plugins.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from ._rule import Rule

hookspec = pluggy.HookspecMarker("qbuild")


@hookspec
def qbuild_rule_types() -> list[type[Rule]]:
    """Return the rule classes this plugin provides.

    All implementations are called and their lists concatenated. Two plugins providing
    the same ``kind`` is an error naming both distributions. Keep this cheap: import
    heavy libraries inside ``Rule.run``, not at module level.
    """


@hookspec(historic=True)
def qbuild_addhooks(pluginmanager: pluggy.PluginManager) -> None:
    """Add hook specifications of your own (``pluginmanager.add_hookspecs(module)``),
    so that other plugins can extend yours (for example dataset readers or dtype
    targets). Called once for every plugin as it is registered."""


@hookspec
def qbuild_action_finished(event: dict[str, Any]) -> None:
    """Called in the main process after each action finishes or is served from cache.

    ``event`` is the same JSON-serializable dict written to the event log: ``label``,
    ``status`` ("ran", "cached", "failed", "skipped"), ``seconds``, ``key``.
    """


@hookspec
def qbuild_build_finished(summary: dict[str, Any]) -> None:
    """Called once at the end of ``qbuild build`` with the closing summary."""
