"""What becomes of each target of a build: the build's side of ``scheduler.Targets``.

``Outcomes`` answers the scheduler for one build: ``prepare`` keys a ready target and
looks it up (through the ``Rebuilder``; the incremental path's last result first),
``finished``, ``skipped`` and ``fail`` record how it ended in the ``BuildResult``, and
every outcome goes out as an ``ActionEvent`` to the reporter and the hooks. It is made
by ``build.run.Build`` with what it needs, and never calls back into it: the build loop
(``Build.run``) drives the scheduler, the scheduler asks this.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..analysis.graph import Graph
from ..api.actions import RunContext
from ..core.errors import QbuildError
from ..core.labels import Label
from ..core.protocols import Origin, Store
from ..core.records import ActionResult, KeyParts, Outcome, TargetActions
from ..events import ActionEvent
from ..execution.failures import ActionFailed
from ..keys.keyer import Keyer
from ..keys.parts import diff
from .plan import Plan
from .progress import Reporter
from .rebuild import Rebuilder, one_line
from .state import WorkspaceState

if TYPE_CHECKING:
    from ..shortcuts.incremental import Reuse


@dataclass
class BuildResult:
    """What a build did; the testing helpers and the CLI read it."""

    ok: bool = True
    requested: list[str] = field(default_factory=list)
    ran: list[str] = field(default_factory=list)
    cached: list[str] = field(default_factory=list)
    remote_hits: list[str] = field(default_factory=list)
    remote: dict[str, Any] | None = None
    remote_execution: dict[str, Any] | None = None
    failed: dict[str, str] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    # failed or skipped targets only their tolerating dependents needed (``_plan``):
    # label -> the reason their dependents were given; the build is still ok
    tolerated: dict[str, str] = field(default_factory=dict)
    failed_ran: list[str] = field(default_factory=list)  # failed while running (not before)
    skip_reasons: dict[str, str] = field(default_factory=dict)
    outputs: dict[str, list[str]] = field(default_factory=dict)  # absolute paths
    infos: dict[str, dict[str, Any]] = field(default_factory=dict)
    providers: dict[str, dict[str, Any]] = field(default_factory=dict)
    actions: dict[str, dict[str, str]] = field(default_factory=dict)  # action -> ran/cached
    explanations: dict[str, list[str]] = field(default_factory=dict)
    bytes_hashed: int = 0
    seconds: float = 0.0


def cached_record(label: str, key: str, origin: str = "local_cache") -> dict[str, Any]:
    """``ActionEvent(label, "cached", key=key, origin=origin).to_json()``, made
    directly (a test holds them equal)."""
    return {"label": label, "status": "cached", "seconds": 0.0, "key": key,
            "origin": origin}


class Outcomes:
    """The answers to the scheduler about each target of one build, and the record of
    how each ended (``result``)."""

    def __init__(self, *, graph: Graph, rebuilder: Rebuilder, reporter: Reporter,
                 store: Store, state: WorkspaceState, keyer: Keyer, root: Path,
                 action_hook: Any, explain: bool, cpu_budget: int,
                 reuse: Reuse | None) -> None:
        self.graph = graph
        self.rebuilder = rebuilder
        self.reporter = reporter
        self.store = store
        self.state = state
        self.keyer = keyer
        self.root = root
        self._action_hook = action_hook
        self.explain = explain
        self.cpu_budget = cpu_budget
        self.reuse = reuse
        self.result = BuildResult()
        self.plan = Plan([], {})  # (the build's own, once ``Build.scheduler`` made it)
        self._soft_skips: set[str] = set()

    # -- scheduler.Targets ---------------------------------------------------------------
    def queued(self, label: Label) -> None:
        self.reporter.action_queued(str(label))

    def prepare(self, label: Label) -> TargetActions | bool:
        """Key a ready target and look it up: True for a hit, False when it cannot even
        be keyed (a source vanished), else the action to run with its grant."""
        target = self.graph.targets[label]
        for dep in self.plan.tolerated_deps(label):
            # the stand-in the action gets; its reason is part of the key, so a result
            # made without the dependency is never served once the dependency builds
            name = str(dep)
            reason = (self.result.tolerated.get(name) or self.result.failed.get(name)
                      or self.result.skip_reasons.get(name, "did not build"))
            self.rebuilder.results.setdefault(dep, ActionResult.failure(reason))
        if self.reuse is not None:
            taken = self.reuse.take(label, target.deps, self.rebuilder.results)
            if taken is not None:
                key, result, sources = taken
                self.rebuilder.reuse(label, key, result, sources)
                self.result.cached.append(str(label))
                self.event(ActionEvent(str(label), "cached", key=key, origin="local_cache"))
                return True
        try:
            action, cached, origin = self.rebuilder.lookup(target)
        except (OSError, QbuildError, RecursionError, ValueError) as exc:
            self.fail(label, self.scrub(one_line(exc)), "")
            return False
        if cached is not None:
            self._cached(label, action.key, cached, origin)
            return True
        if self.explain:
            self._explain(label, self.rebuilder.parts[label])
        assert target.rule is not None
        cores, mib = target.rule.resources(target.attrs)
        action = replace(action, threads=max(1, min(int(cores), self.cpu_budget)),
                         memory_mib=max(0, int(mib)),
                         accelerators=target.rule.accelerators_for(target.attrs))
        self.rebuilder.actions[label] = action
        return action

    def finished(self, label: Label, future: concurrent.futures.Future[Outcome]) -> bool:
        try:
            outcome = future.result()
        except ActionFailed as exc:
            if exc.started:  # (refused, or its inputs could not be staged: it never ran)
                self.result.failed_ran.append(str(label))
            self.fail(label, self.scrub(str(exc.error)), self.scrub(exc.log_tail),
                         key=self.rebuilder.actions[label].key, where=exc.where)
            return False
        if outcome.status == "cached":  # another process ran it while this one waited
            self._cached(label, self.rebuilder.actions[label].key, outcome.result, "local")
            return True
        self.result.ran.append(str(label))
        if outcome.actions:
            self.result.actions[str(label)] = {name: status for name, _, status in outcome.actions}
        self.event(ActionEvent(str(label), "ran", outcome.seconds,
                                key=self.rebuilder.actions[label].key, origin="ran",
                                rule=self.graph.targets[label].kind,
                                warnings=tuple(w.replace(RunContext.THIS_TARGET, str(label))
                                               for w in outcome.result.warnings),
                                worker=outcome.worker or None))
        return True

    def skipped(self, label: Label, failed_deps: list[Label]) -> None:
        if label in self.plan.soft and failed_deps:
            first = str(failed_deps[0])
            reason = self.result.tolerated.get(first) or self.result.failed.get(first, "")
            if first not in self._soft_skips:  # the failure itself: name it
                reason = f"{first} failed: {reason}"
            self._soft_skips.add(str(label))
            self.result.tolerated[str(label)] = reason
            self.event(ActionEvent(str(label), "skipped", tolerated=True))
            return
        if not failed_deps:
            reason = "not started: the build stops at the first failure (see --keep_going)"
        else:
            first = str(failed_deps[0])
            reason = (f"depends on failed {first}" if first in self.result.failed
                      else f"depends on skipped {first}")
        self.result.skipped.append(str(label))
        self.result.skip_reasons[str(label)] = reason
        self.event(ActionEvent(str(label), "skipped"))

    # -- outcomes --------------------------------------------------------------------------
    def _cached(self, label: Label, key: str, result: ActionResult, origin: Origin) -> None:
        self.rebuilder.hit(label, key, result)
        name = str(label)
        self.result.cached.append(name)
        if origin == "remote":
            self.result.remote_hits.append(name)
        if self._action_hook.get_hookimpls():
            self.event(ActionEvent(name, "cached", key=key, origin=f"{origin}_cache"))
        else:  # (no hook to hand the event to: only its record)
            self.reporter.action_finished(cached_record(name, key, f"{origin}_cache"))

    def fail(self, label: Label, error: str, log_tail: str, key: str | None = None,
                where: str = "") -> None:
        soft = label in self.plan.soft
        shown = f"{error} ({where})" if where else error
        if soft:  # the reason its dependents get, in their keys: not where it ran
            self.result.tolerated[str(label)] = error
        else:
            self.result.failed[str(label)] = shown
        self.event(ActionEvent(str(label), "failed", key=key, error=shown,
                                log_tail=log_tail, tolerated=soft))

    def event(self, event: ActionEvent) -> None:
        self.reporter.action_finished(event.to_json())
        if self._action_hook.get_hookimpls():  # (none in most builds: no call at all)
            self._action_hook(event=event)

    def scrub(self, text: str) -> str:
        """Error text with sandbox paths written as the workspace-relative paths they
        stand for (sources are staged at those paths, outputs under qbuild-out/)."""
        for tmp in dict.fromkeys((str(self.store.tmp), os.path.realpath(self.store.tmp))):
            text = re.sub(re.escape(tmp) + r"/\d+-[0-9a-f]+/?", "", text)
        for root in dict.fromkeys((str(self.root), os.path.realpath(self.root))):
            text = text.replace(root + os.sep, "")
        return text

    def _explain(self, label: Label, parts: KeyParts) -> None:
        last = self.state.last_keys.get(str(label))
        old = self.store.get_components(last) if last else None
        lines = diff(old, parts, self.keyer.code_files) or [
            "no recorded difference (the cached result was removed)"]
        self.result.explanations[str(label)] = lines
        self.reporter.message(f"{label} will run: " + "; ".join(lines))
