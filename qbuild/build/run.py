"""One ``qbuild build`` run: the composition of the build's parts over a session.

``Build.run`` analyses the requested targets, makes a ``Plan`` of them, lets the
``Scheduler`` drive it (cache hits finish at once; misses run through the ``Rebuilder``
on the session's ``Executor``), has the ``Materializer`` place the requested outputs,
and reports: events to the reporter and the hooks (``qbuild.events``), explanations for
``--explain``, and a ``BuildResult`` for the command line and the test helpers.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ..analysis.graph import Graph, Target
from ..analysis.plugins import Registry
from ..analysis.workspace import Workspace, claim_output_dir
from ..api.actions import RunContext
from ..core.errors import QbuildError
from ..core.files import SourceDigests
from ..core.generation import new_fact_generation
from ..core.labels import Label
from ..core.protocols import Executor, Origin, Store
from ..core.records import ActionResult, KeyParts, Outcome, TargetActions
from ..events import ActionEvent, BuildSummary, Failure
from ..execution.failures import ActionFailed
from ..execution.local import LocalExecutor
from ..keys.keyer import Keyer
from ..keys.parts import diff
from .materialize import Materializer
from .plan import Plan
from .progress import Reporter
from .rebuild import Rebuilder, one_line
from .scheduler import Scheduler
from .state import WorkspaceState

if TYPE_CHECKING:
    from ..shortcuts.incremental import Reuse
    from ..store.http import RemoteConfig
    from ..store.remote import LayeredStore

__all__ = ["Build", "BuildOptions", "BuildResult", "BuildSession"]


@dataclass(frozen=True)
class BuildOptions:
    jobs: int = 1
    keep_going: bool = False
    explain: bool = False
    cpu: int | None = None  # --local_resources cpu=N (default: the CPU count)
    memory: int | None = None  # --local_resources memory=MiB (default: 2/3 of RAM)
    remote_executor: Any = None  # _dask_executor.RemoteExecution: run actions on a cluster


def _default_memory_mib() -> int:
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 20
    return max(1, int(total * 2 / 3) >> 20)


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


_TOLERANT: dict[type, bool] = {}  # rule class -> has an attribute tolerating failures


def _tolerated(target: Target) -> set[Label]:
    """The dependencies of ``target`` named only by attributes declared
    ``tolerate_failures`` (one named by another attribute too is not tolerated)."""
    if target.rule is None:
        return set()
    schema = target.rule.attrs
    any_soft = _TOLERANT.get(type(target.rule))
    if any_soft is None:  # asked once per rule class: builds of 10,000 targets ask often
        any_soft = _TOLERANT[type(target.rule)] = any(
            spec.tolerate_failures for spec in schema.values())
    if not any_soft:
        return set()
    soft: set[str] = set()
    hard: set[str] = set()
    for name, spec in schema.items():
        if not spec.is_dependency() or name not in target.attrs:
            continue
        value = target.attrs[name]
        names = value if isinstance(value, list) else [value]
        (soft if spec.tolerate_failures else hard).update(
            v for v in names if isinstance(v, str))
    if not soft:
        return set()
    return {dep for dep in target.deps if str(dep) in soft and str(dep) not in hard}


def _expand_groups(graph: Graph, labels: list[Label]) -> list[Label]:
    out: list[Label] = []
    for label in labels:
        target = graph.targets[label]
        if target.is_group:
            out.extend(_expand_groups(graph, target.deps))
        else:
            out.append(label)
    return list(dict.fromkeys(out))


class BuildSession(Protocol):
    """What a build runs over: the parts a ``Session`` wires (``build.session``)."""

    workspace: Workspace
    registry: Registry
    graph: Graph
    remote: RemoteConfig | None

    @property
    def store(self) -> Store: ...
    @property
    def digests(self) -> SourceDigests: ...
    @property
    def keyer(self) -> Keyer: ...
    @property
    def remote_store(self) -> LayeredStore | None: ...


class Build:
    """One ``qbuild build`` run over a session."""

    def __init__(self, session: BuildSession, options: BuildOptions, reporter: Reporter,
                 executor: Executor | None = None, reuse: Reuse | None = None) -> None:
        self.session = session
        self.reuse = reuse  # the last build's keys and results (``_incremental``)
        self.options = options
        self.reporter = reporter
        self.graph = session.graph
        self.store = session.store
        claim_output_dir(session.workspace.output_dir)
        self.state = WorkspaceState(session.workspace.output_dir)
        self.result = BuildResult()
        self._action_hook = session.registry.pm.hook.qbuild_action_finished
        self.plan = Plan([], {})  # (the build's own, from ``scheduler``)
        self._soft_skips: set[str] = set()
        # The remote layer, when configured.
        self.remote: LayeredStore | None = session.remote_store
        if self.remote is not None:
            self.remote.warn = reporter.message
        # inline: a local miss runs in the thread that submits it (no hand-over between
        # two pools); a remote executor keeps its own threads for local fallbacks
        local = None if executor is not None else LocalExecutor(
            self.store, session.workspace.root, session.digests, options.jobs,
            inline=options.remote_executor is None)
        inner: Executor = executor or local  # type: ignore[assignment]
        self.cpu_budget = max(1, options.cpu or os.cpu_count() or 1)
        self.memory_budget = max(1, options.memory or _default_memory_mib())
        self.remote_executor: Any = None
        if local is not None and options.remote_executor is not None:
            from ..execution.dask_executor import DaskExecutor

            inner = self.remote_executor = DaskExecutor(
                local, self.store, options.remote_executor, dict(session.workspace.toolchain),
                self.cpu_budget, reporter.message,
                verbose=any(getattr(r, "verbose", False)
                            for r in getattr(reporter, "reporters", (reporter,))))
            # Placement is the cluster's; actions that run here share this machine's
            # cores inside the executor.
            self.cpu_budget = self.memory_budget = 1 << 40
        self.rebuilder = Rebuilder(session.keyer, session.graph, self.store,
                                   session.workspace.root, inner, self.state, options.jobs,
                                   started=lambda label: reporter.action_started(str(label)),
                                   message=reporter.message)
        if self.remote_executor is not None:
            self.remote_executor.parts = self.rebuilder.parts  # what workers check
        self.materializer = Materializer(session.workspace.output_dir, self.store, self.state,
                                         self.rebuilder.results.__getitem__,
                                         self.rebuilder.rebuild)
        # Requested targets placed as soon as their action ran: {label: (the result
        # placed, the paths)}; kept if that is still the target's result at the end.
        self._requested: set[Label] = set()
        self._placed_early: dict[Label, tuple[ActionResult, list[str]]] = {}
        self.rebuilder.ran = self._place_early

    @property
    def results(self) -> dict[Label, ActionResult]:
        return self.rebuilder.results

    @property
    def actions(self) -> dict[Label, TargetActions]:
        return self.rebuilder.actions

    def run(self, roots: list[Label]) -> BuildResult:
        started = time.monotonic()
        order = self.graph.analyze(roots)
        requested = _expand_groups(self.graph, roots)
        self.result.requested = [str(x) for x in requested]
        self._requested = set(requested)
        actionable = [x for x in order if not self.graph.targets[x].is_group]
        self.reporter.build_started(len(actionable))
        if self.reuse is None:
            # Every target is about to be looked up: read the entries of the keys they
            # had last time in a few queries (a key that changed is looked up alone).
            last = self.state.last_keys
            self.store.prefetch_actions(
                [last[str(label)] for label in actionable if str(label) in last])
        interrupted = False
        try:
            if self.reuse is not None:
                order = self._reuse_untouched(order)
            self.scheduler(order, requested).run()
            for label in requested:
                if label in self.results:
                    early = self._placed_early.get(label)
                    if early is not None and early[0] is self.results[label]:
                        self.result.outputs[str(label)] = early[1]
                    else:
                        self._materialize(label)
                else:
                    self.materializer.remove(label)
        except KeyboardInterrupt:
            interrupted = True
            self.rebuilder.kill()
            raise
        finally:
            if not interrupted:
                self.rebuilder.close()
            try:
                self.state.save()
            except OSError:
                pass  # only costs re-verification next time
            self._finish(requested, started, interrupted)
        return self.result

    def _reuse_untouched(self, order: list[Label]) -> list[Label]:
        """Give every target the incremental path reuses along with all its dependencies
        its last result at once (``Reuse.untouched``: the answer ``prepare`` would give
        it, without planning it); return the rest of ``order``, for the plan."""
        assert self.reuse is not None
        untouched = self.reuse.untouched(order, self.graph.targets)
        if not untouched:
            return order
        reuse, cached, event = self.rebuilder.reuse, self.result.cached, self._event
        report = self.reporter.action_finished
        hooked = bool(self._action_hook.get_hookimpls())
        for label, (key, result, sources) in untouched.items():
            reuse(label, key, result, sources)
            name = str(label)
            cached.append(name)
            if hooked:
                event(ActionEvent(name, "cached", key=key, origin="local_cache"))
            else:  # (no hook to hand the event to: only its record)
                report(cached_record(name, key))
        return [label for label in order if label not in untouched]

    def scheduler(self, order: list[Label], requested: list[Label] | None = None
                  ) -> Scheduler:
        """The scheduler of this build's plan (analysis order, dependencies first; a
        dependency outside ``order`` is done already)."""
        targets = self.graph.targets
        if self.reuse is None:  # (every dependency is in the plan)
            deps = {label: targets[label].deps for label in order}
        else:
            planned = set(order)
            deps = {label: [dep for dep in targets[label].deps if dep in planned]
                    for label in order}
        plan = self.plan = Plan(
            order, deps, weight=lambda label: 0 if targets[label].entry is None else 1,
            tolerant={label: ds for label in order if (ds := _tolerated(targets[label]))},
            requested=order if requested is None else requested)
        return Scheduler(plan, self.rebuilder, self, jobs=self.options.jobs,
                         cpu=self.cpu_budget, memory=self.memory_budget,
                         keep_going=self.options.keep_going)

    def _finish(self, requested: list[Label], started: float, interrupted: bool) -> None:
        result = self.result
        result.ok = not result.failed and not result.skipped and not interrupted
        result.bytes_hashed = self.session.digests.bytes_hashed
        result.remote = self.remote.summary() if self.remote is not None else None
        if self.remote_executor is not None:
            result.remote_execution = self.remote_executor.summary()
        result.seconds = time.monotonic() - started
        for label, r in self.results.items():
            if r.failed is not None:
                continue
            name = str(label)
            result.infos[name] = dict(r.info)
            result.providers[name] = dict(r.providers)
        summary = BuildSummary(
            ok=result.ok, targets=len(requested), actions_run=len(result.ran),
            cache_hits=len(result.cached), failed=len(result.failed),
            skipped=len(result.skipped), seconds=result.seconds,
            bytes_hashed=result.bytes_hashed, failed_ran=len(result.failed_ran),
            failures=self._failures(),
            tolerated=dict(result.tolerated),
            skipped_reasons=dict(result.skip_reasons), cache_dir=str(self.store.directory),
            cache_bytes=self.store.volume(), interrupted=interrupted,
            remote_cache_hits=len(result.remote_hits) if result.remote is not None else None,
            remote=result.remote, remote_execution=result.remote_execution)
        self.reporter.build_finished(summary.to_json())
        self.session.registry.pm.hook.qbuild_build_finished(summary=summary)
        new_fact_generation()

    def _failures(self) -> tuple[Failure, ...]:
        """Each failed target with where it failed: while running, before it could
        start, or (its result made or found) while its outputs were placed."""
        result = self.result
        if not result.failed:
            return ()
        ran = set(result.failed_ran)
        had = set(result.ran) | set(result.cached)
        return tuple(Failure(label, error, label in ran,
                             "ran" if label in ran else "not_placed" if label in had
                             else "not_started")
                     for label, error in result.failed.items())

    # -- scheduler.Targets: what the scheduler asks of the build ---------------------------
    def is_group(self, label: Label) -> bool:
        return self.graph.targets[label].is_group

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
            taken = self.reuse.take(label, target.deps, self.results)
            if taken is not None:
                key, result, sources = taken
                self.rebuilder.reuse(label, key, result, sources)
                self.result.cached.append(str(label))
                self._event(ActionEvent(str(label), "cached", key=key, origin="local_cache"))
                return True
        try:
            action, cached, origin = self.rebuilder.lookup(target)
        except (OSError, QbuildError, RecursionError, ValueError) as exc:
            self._failed(label, self._scrub(one_line(exc)), "")
            return False
        if cached is not None:
            self._cached(label, action.key, cached, origin)
            return True
        if self.options.explain:
            self._explain(label, self.rebuilder.parts[label])
        assert target.rule is not None
        cores, mib = target.rule.resources(target.attrs)
        from dataclasses import replace

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
            self._failed(label, self._scrub(str(exc.error)), self._scrub(exc.log_tail),
                         key=self.rebuilder.actions[label].key, where=exc.where)
            return False
        if outcome.status == "cached":  # another process ran it while this one waited
            self._cached(label, self.rebuilder.actions[label].key, outcome.result, "local")
            return True
        self.result.ran.append(str(label))
        if outcome.actions:
            self.result.actions[str(label)] = {name: status for name, _, status in outcome.actions}
        self._event(ActionEvent(str(label), "ran", outcome.seconds,
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
            self._event(ActionEvent(str(label), "skipped", tolerated=True))
            return
        if not failed_deps:
            reason = "not started: the build stops at the first failure (see --keep_going)"
        else:
            first = str(failed_deps[0])
            reason = (f"depends on failed {first}" if first in self.result.failed
                      else f"depends on skipped {first}")
        self.result.skipped.append(str(label))
        self.result.skip_reasons[str(label)] = reason
        self._event(ActionEvent(str(label), "skipped"))

    # -- outcomes --------------------------------------------------------------------------
    def _cached(self, label: Label, key: str, result: ActionResult, origin: Origin) -> None:
        self.rebuilder.hit(label, key, result)
        name = str(label)
        self.result.cached.append(name)
        if origin == "remote":
            self.result.remote_hits.append(name)
        if self._action_hook.get_hookimpls():
            self._event(ActionEvent(name, "cached", key=key, origin=f"{origin}_cache"))
        else:  # (no hook to hand the event to: only its record)
            self.reporter.action_finished(cached_record(name, key, f"{origin}_cache"))

    def _failed(self, label: Label, error: str, log_tail: str, key: str | None = None,
                where: str = "") -> None:
        soft = label in self.plan.soft
        shown = f"{error} ({where})" if where else error
        if soft:  # the reason its dependents get, in their keys: not where it ran
            self.result.tolerated[str(label)] = error
        else:
            self.result.failed[str(label)] = shown
        self._event(ActionEvent(str(label), "failed", key=key, error=shown,
                                log_tail=log_tail, tolerated=soft))

    def _event(self, event: ActionEvent) -> None:
        self.reporter.action_finished(event.to_json())
        if self._action_hook.get_hookimpls():  # (none in most builds: no call at all)
            self._action_hook(event=event)

    def _scrub(self, text: str) -> str:
        """Error text with sandbox paths written as the workspace-relative paths they
        stand for (sources are staged at those paths, outputs under qbuild-out/)."""
        for tmp in dict.fromkeys((str(self.store.tmp), os.path.realpath(self.store.tmp))):
            text = re.sub(re.escape(tmp) + r"/\d+-[0-9a-f]+/?", "", text)
        for root in dict.fromkeys((str(self.session.workspace.root),
                                   os.path.realpath(self.session.workspace.root))):
            text = text.replace(root + os.sep, "")
        return text

    def _explain(self, label: Label, parts: KeyParts) -> None:
        last = self.state.last_keys.get(str(label))
        old = self.store.get_components(last) if last else None
        lines = diff(old, parts, self.session.keyer.code_files) or [
            "no recorded difference (the cached result was removed)"]
        self.result.explanations[str(label)] = lines
        self.reporter.message(f"{label} will run: " + "; ".join(lines))

    # -- outputs ------------------------------------------------------------------------
    def _place_early(self, label: Label, result: ActionResult) -> None:
        """Place a requested target's new outputs in the action's thread, overlapping
        the actions still running (placing 10,000 outputs one after another at the end
        was a fifth of a cold build). Anything that goes wrong is left to the placing
        at the end, which also retries by running the action again."""
        if label not in self._requested:
            return
        try:
            paths = self.materializer.place(label, rebuild=False)
        except Exception:  # noqa: BLE001 - placed (or reported) at the end instead
            return
        self._placed_early[label] = (result, paths)

    def _materialize(self, label: Label) -> None:
        try:
            self.result.outputs[str(label)] = self.materializer.place(label)
        except (ActionFailed, QbuildError, OSError) as exc:
            self._failed(label, str(exc.error if isinstance(exc, ActionFailed) else exc), "")
            self.materializer.remove(label)
            self.result.outputs.pop(str(label), None)

    # -- what the no-op fast path may rely on ----------------------------------------------
    def reads(self) -> dict[str, str | None] | None:
        """Every stat this build's result rests on, as taken when it was read (BUILD
        files, listed directories, sources as digested); None if one file was seen in
        two states, or when a failure was tolerated (the next build must try it again)."""
        if self.result.tolerated:
            return None
        loader_reads = self.graph.loader.reads
        if loader_reads.conflicting:
            return None
        stats = dict(loader_reads.stats)
        stats["qbuild.toml"] = self.session.workspace.marker_stat
        for sources in self.rebuilder.sources.values():
            for rel, (_digest, key) in sources.items():
                if stats.setdefault(rel, key) != key:
                    return None
        return stats

    def source_files(self) -> set[str]:
        """Workspace-relative paths of every source the actions of this build read."""
        return {rel for sources in self.rebuilder.sources.values() for rel in sources}

    def code_files(self) -> set[str]:
        """Every rule code file the keys of this build rest on (hashed now, or by the
        build whose keys were reused), and the files plugins name as what their
        environment facts rest on (``qbuild_key_files``)."""
        keyer = self.session.keyer
        files = set(keyer.code.files_read) if keyer.code_used else set()
        if self.reuse is not None:
            files.update(self.reuse.code_files)
        # What plugins' environment facts rest on (the tools a command runs): stat'ed
        # like code by the paths that skip keying (and carried forward as code is).
        for found in self.session.registry.pm.hook.qbuild_key_files():
            files.update(str(path) for path in found or ())
        return files

    def reusable(self) -> dict[str, tuple[str, ActionResult, Mapping[str, tuple[str, str]]]]:
        """Key, result and sources of every target, for the next build's incremental
        path; empty unless every target got its result the plain way."""
        if not self.result.ok or self.rebuilder.rebuilt or self.result.tolerated:
            return {}  # (a tolerated failure is retried by the next build's full path)
        last = self.state.last_keys
        out = {}
        for label, result in self.results.items():
            key, sources = last.get(str(label)), self.rebuilder.sources.get(label)
            if key is None or sources is None:
                return {}
            out[str(label)] = (key, result, sources)
        return out

    def placed_outputs(self) -> dict[str, str]:
        """Stats of the requested targets' files in the output folder, as placed."""
        workspace = self.session.workspace
        base = os.path.relpath(workspace.output_dir, workspace.root).replace(os.sep, "/")
        materialized = self.state.materialized
        return {f"{base}/{rel}": materialized[rel][1] for rel in self.materializer.placed
                if rel in materialized}

