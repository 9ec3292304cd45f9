"""One ``qbuild build`` run: the composition of the build's parts over a session.

``Build.run`` analyses the requested targets, makes a ``Plan`` of them, lets the
``Scheduler`` drive it (asking the build's ``Outcomes`` about each target: cache hits
finish at once; misses run through the ``Rebuilder`` on the session's ``Executor``), has
the ``Materializer`` place the requested outputs, and reports: events to the reporter
and the hooks (``qbuild.events``), explanations for ``--explain``, and a
``BuildResult`` for the command line and the test helpers. Nothing it drives calls
back into it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..analysis.graph import Graph, Target
from ..analysis.plugins import Registry
from ..analysis.workspace import Workspace, claim_output_dir
from ..core.errors import QbuildError
from ..core.generation import new_fact_generation
from ..core.labels import Label
from ..core.protocols import Executor, Store
from ..core.records import ActionResult, TargetActions
from ..events import ActionEvent, BuildSummary, Failure
from ..execution.failures import ActionFailed
from ..execution.local import LocalExecutor
from ..keys.keyer import Keyer
from ..store.digests import SourceDigests
from .materialize import Materializer
from .outcomes import BuildResult, Outcomes, cached_record
from .plan import Plan
from .progress import Reporter
from .rebuild import Rebuilder
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


@dataclass(frozen=True)
class BuildSession:
    """What a build runs over: the parts a ``Session`` wires (``build.session``), handed
    down made (the build never calls back into the session that made them)."""

    workspace: Workspace
    registry: Registry
    graph: Graph
    remote: RemoteConfig | None
    store: Store
    digests: SourceDigests
    keyer: Keyer
    remote_store: LayeredStore | None


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
        self._action_hook = session.registry.pm.hook.qbuild_action_finished
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
                                   started=reporter.action_started,
                                   message=reporter.message)
        if self.remote_executor is not None:
            self.remote_executor.parts = self.rebuilder.parts  # what workers check
        # What the scheduler asks about each target, and the record of how each ended.
        self.outcomes = Outcomes(
            graph=self.graph, rebuilder=self.rebuilder, reporter=reporter, store=self.store,
            state=self.state, keyer=session.keyer, root=session.workspace.root,
            action_hook=self._action_hook, explain=options.explain,
            cpu_budget=self.cpu_budget, reuse=reuse)
        self.result = self.outcomes.result
        self.plan = self.outcomes.plan  # (the build's own, from ``scheduler``)
        self.materializer = Materializer(session.workspace.output_dir, self.store, self.state,
                                         self.rebuilder.results.__getitem__,
                                         self.rebuilder.rebuild)
        self.rebuilder.ran = self.materializer.place_early

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
        self.materializer.requested = set(requested)
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
                    early = self.materializer.early.get(label)
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
        reuse, cached, event = self.rebuilder.reuse, self.result.cached, self.outcomes.event
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
        plan = self.plan = self.outcomes.plan = Plan(
            order, deps, groups=[label for label in order if targets[label].entry is None],
            tolerant={label: ds for label in order if (ds := _tolerated(targets[label]))},
            requested=order if requested is None else requested)
        return Scheduler(plan, self.rebuilder, self.outcomes, jobs=self.options.jobs,
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

    # -- outputs ------------------------------------------------------------------------
    def _materialize(self, label: Label) -> None:
        try:
            self.result.outputs[str(label)] = self.materializer.place(label)
        except (ActionFailed, QbuildError, OSError) as exc:
            self.outcomes.fail(label, str(exc.error if isinstance(exc, ActionFailed) else exc),
                               "")
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

