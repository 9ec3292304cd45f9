"""The hook specifications plugins implement: qbuild's whole plugin contract.

Every hook is prefixed ``qbuild_``. Implement them as module-level functions decorated
with ``qbuild.hookimpl`` in the module your ``qbuild`` entry point names. A hook
implementation may take fewer arguments than the spec (pluggy's opt-in arguments), so
new arguments can be added later without breaking plugins.

Events are typed, frozen objects (``qbuild.events``); implementations written for the
earlier dict events keep working, since the objects also answer ``event["label"]`` and
``event.get(...)``.

Hooks a plugin defines for other plugins (``qbuild_addhooks``) are resolved once, in
the main process, for each rule that declares it calls them (``"hook:<name>"`` in
``Rule.code()``): the implementing plugins enter the action key, and the action calls
exactly those through ``ctx.hooks.<name>(...)``, in whatever process runs it. A plugin
is left out entirely with ``-p no:NAME`` (or ``plugins = ["no:NAME"]`` under
``[settings]`` in ``qbuild.toml``); ``qbuild info --plugins`` lists what is loaded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from .api.rule import Rule
    from .events import ActionEvent, BuildSummary

hookspec = pluggy.HookspecMarker("qbuild")


@hookspec
def qbuild_rule_types() -> list[type[Rule]]:  # type: ignore[empty-body]
    """Return the rule classes this plugin provides.

    All implementations are called and their lists concatenated. Two plugins providing
    the same ``kind`` is an error naming both distributions. Keep this cheap: import
    heavy libraries inside ``Rule.run``, not at module level.
    """


@hookspec(historic=True)
def qbuild_addhooks(pluginmanager: pluggy.PluginManager) -> None:
    """Add hook specifications of your own (``pluginmanager.add_hookspecs(module)``),
    so that other plugins can extend yours (for example dataset readers or dtype
    targets). Called once for every plugin as it is registered. Rules that call such a
    hook return ``"hook:<name>"`` from ``Rule.code()`` and call ``ctx.hooks.<name>()``."""


@hookspec
def qbuild_action_finished(event: ActionEvent) -> None:
    """Called in the main process after each action finishes or is served from cache.

    ``event`` (``qbuild.events.ActionEvent``) has ``label``, ``status`` ("ran",
    "cached", "failed", "skipped"), ``seconds``, ``key`` (the action key; None when
    skipped or failed before it was keyed), ``origin``, ``rule``, ``warnings``, and
    ``error``/``log_tail`` for failures. ``event.to_json()`` is the event-log record.
    """


@hookspec
def qbuild_build_finished(summary: BuildSummary) -> None:
    """Called once at the end of ``qbuild build`` with the closing summary
    (``qbuild.events.BuildSummary``; ``summary.to_json()`` is the event-log record)."""


@hookspec
def qbuild_key_files() -> list[str]:  # type: ignore[empty-body]
    """Return the absolute paths of files and folders outside the workspace whose
    content a key part of this plugin's rules rests on (``Rule.target_env`` facts such
    as the tools a command runs, and the PATH folders they were looked up in).

    The no-op fast path and the incremental path skip keying; they stat these paths
    instead, as they stat rule code, and take the full path when one changed. Return
    every path read so far in this process (more than needed is harmless).
    """
