"""The build: schedule analysed targets in dependency order, serve hits from the action
cache, run misses in parallel, store results, and materialize requested outputs.

Scheduling is topological (BUILD dependencies are static); rebuilding follows a
constructive trace: an action's key is computed from its inputs' content, so a
dependency rebuilt to identical bytes gives the same key and stops the rebuild there
(early cutoff).
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._analysis import Graph, Target
from ._code import CodeDigests
from ._digest import SourceDigests, hash_file, stat_key
from ._errors import QbuildError
from ._executor import Action, ActionFailed, LocalExecutor, MissingBlob, label_dir
from ._keys import action_key, components, diff
from ._label import Label
from ._plugins import Registry
from ._progress import Reporter
from ._state import WorkspaceState
from ._store import LocalStore
from ._workspace import Workspace, claim_output_dir

if TYPE_CHECKING:
    import concurrent.futures

    from ._remote_http import RemoteConfig
    from ._remote_store import LayeredStore


@dataclass
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
    failed_ran: list[str] = field(default_factory=list)  # failed while running (not before)
    skip_reasons: dict[str, str] = field(default_factory=dict)
    outputs: dict[str, list[Path]] = field(default_factory=dict)
    infos: dict[str, dict[str, Any]] = field(default_factory=dict)
    explanations: dict[str, list[str]] = field(default_factory=dict)
    bytes_hashed: int = 0
    seconds: float = 0.0


class Session:
    """The engine objects one command works with."""

    def __init__(self, workspace: Workspace, registry: Registry,
                 remote: RemoteConfig | None = None) -> None:
        self.workspace = workspace
        self.registry = registry
        self.graph = Graph(workspace, registry)
        self.remote = remote
        self._store: Any = None
        self._digests: SourceDigests | None = None
        self._code: CodeDigests | None = None

    @property
    def store(self) -> LocalStore:
        """The local store, layered over the remote cache when one is configured."""
        if self._store is None:
            local = LocalStore(self.workspace.cache_dir)
            if self.remote is not None:
                from ._remote_store import LayeredStore

                self._store = LayeredStore(local, self.remote)
            else:
                self._store = local
        return self._store

    @property
    def digests(self) -> SourceDigests:
        if self._digests is None:
            self._digests = SourceDigests(self.store)
        return self._digests

    @property
    def code(self) -> CodeDigests:
        if self._code is None:
            dists = sorted({e.dist for e in self.registry.entries.values()})
            self._code = CodeDigests(self.digests, dists)
        return self._code

    def close(self) -> None:
        if self._store is not None:
            self._store.close()

    def code_parts(self, target: Target) -> dict[str, str]:
        """Digest of every code unit ``target``'s action runs (see ``_code``)."""
        assert target.rule is not None
        refs = target.rule.code(target.attrs) or []
        units = self.code.units_for(type(target.rule), refs, self.registry.pm)
        return {unit: self.code.unit(unit)[0] for unit in units}

    def code_files(self, digest: str) -> dict[str, str] | None:
        """The per-file digests of a code unit by its digest (for explanations)."""
        for known, files in self.code._units.values():
            if known == digest:
                return files
        return self.store.get_code(digest)

    def save_code(self, parts: dict[str, Any]) -> None:
        for unit in parts["code"]:
            digest, files = self.code.unit(unit)
            self.store.put_code(digest, files)

    def key_for(self, target: Target, results: dict[Label, dict[str, Any]]
                ) -> tuple[dict[str, Any], str, Action]:
        """Key components, key and runnable action of ``target`` given its deps' results."""
        root = self.workspace.root
        sources = {rel: self.digests.digest(root / rel) for rel in target.sources}
        executable = [rel for rel in target.sources
                      if os.stat(root / rel).st_mode & stat.S_IXUSR]
        deps = {}
        for dep in target.deps:
            result = results[dep]
            deps[str(dep)] = {"outputs": result["outputs"], "declared": result["declared"],
                              "info": result["info"]}
        parts = components(target, {rel: d for rel, (d, _) in sources.items()}, deps,
                           self.code_parts(target), executable)
        key = action_key(parts)
        assert target.entry is not None and target.rule is not None
        action = Action(
            label=str(target.label), build_file=target.build_file, rule_ref=target.entry.ref,
            heavy=bool(target.rule.heavy), attrs=target.attrs,
            attr_types={name: schema.type for name, schema in target.rule.attrs.items()},
            sources=sources, deps=deps, outputs=target.outputs, key=key,
            reproducible=target.rule.is_reproducible(target.attrs),
            parts=parts, resources=target.rule.resources(target.attrs),
        )
        return parts, key, action


def _parse(text: str) -> Label:
    package, name = text[2:].split(":", 1)
    return Label(package, name)


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, QbuildError):
        return str(exc)
    if isinstance(exc, OSError) and exc.strerror:
        where = f" ({exc.filename})" if exc.filename else ""
        return f"{exc.strerror}{where}"
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _expand_groups(graph: Graph, labels: list[Label]) -> list[Label]:
    out: list[Label] = []
    for label in labels:
        target = graph.targets[label]
        if target.is_group:
            out.extend(_expand_groups(graph, target.deps))
        else:
            out.append(label)
    return list(dict.fromkeys(out))


class Build:
    """One ``qbuild build`` run over a session."""

    def __init__(self, session: Session, options: BuildOptions, reporter: Reporter) -> None:
        self.session = session
        self.options = options
        self.reporter = reporter
        self.graph = session.graph
        self.store = session.store
        claim_output_dir(session.workspace.output_dir)
        self.state = WorkspaceState(session.workspace.output_dir)
        self.results: dict[Label, dict[str, Any]] = {}
        self.actions: dict[Label, Action] = {}
        self.result = BuildResult()
        self._rebuild_lock = threading.RLock()
        self._result_lock = threading.Lock()  # job threads record their outcomes
        # The remote layer, when configured (imported only then: it pulls in http.client).
        self.remote: LayeredStore | None = None
        if session.remote is not None:
            self.remote = self.store  # type: ignore[assignment]
            self.remote.warn = reporter.message
        self._placed: set[str] = set()  # output-folder paths of the requested targets
        self.executor = LocalExecutor(self.store, session.workspace.root, session.digests,
                                      options.jobs)
        self.cpu_budget = max(1, options.cpu or os.cpu_count() or 1)
        self.memory_budget = max(1, options.memory or _default_memory_mib())
        self.workers: dict[Label, str] = {}  # remote worker that ran each action
        if options.remote_executor is not None:
            from ._dask_executor import DaskExecutor

            self.executor = DaskExecutor(  # type: ignore[assignment]
                self.executor, self.store, options.remote_executor,
                dict(session.workspace.toolchain), self.cpu_budget, reporter.message)
            # Placement is the cluster's; actions run here share this machine's cores
            # inside the executor.
            self.cpu_budget = self.memory_budget = 1 << 40

    def run(self, roots: list[Label]) -> BuildResult:
        started = time.monotonic()
        order = self.graph.analyze(roots)
        requested = _expand_groups(self.graph, roots)
        self.result.requested = [str(x) for x in requested]
        actionable = [x for x in order if not self.graph.targets[x].is_group]
        self.reporter.build_started(len(actionable))
        interrupted = False
        try:
            self._schedule(order)
            for label in requested:
                if label in self.results:
                    try:
                        self._materialize(label)
                    except (ActionFailed, QbuildError, OSError) as exc:
                        error = exc.error if isinstance(exc, ActionFailed) else exc
                        self._failed(label, _one_line(error) if not isinstance(error, str)
                                     else error, "")
                        _remove_owned(self.session.workspace.output_dir, label_dir(str(label)))
                        self.result.outputs.pop(str(label), None)
                else:
                    _remove_owned(self.session.workspace.output_dir, label_dir(str(label)))
        except KeyboardInterrupt:
            interrupted = True
            self.executor.kill()
            raise
        finally:
            if not interrupted:
                self.executor.close()
            try:
                self.state.save()
            except OSError:
                pass  # only costs re-verification next time
            self._finish(requested, started, interrupted)
        return self.result

    def _finish(self, requested: list[Label], started: float, interrupted: bool) -> None:
        self.result.ok = not self.result.failed and not self.result.skipped and not interrupted
        self.result.bytes_hashed = self.session.digests.bytes_hashed
        self.result.remote = self.remote.summary() if self.remote is not None else None
        if hasattr(self.executor, "summary"):
            self.result.remote_execution = self.executor.summary()
        self.result.seconds = time.monotonic() - started
        summary = {
            "ok": self.result.ok, "targets": len(requested), "actions_run": len(self.result.ran),
            "cache_hits": len(self.result.cached), "failed": len(self.result.failed),
            "skipped": len(self.result.skipped), "seconds": round(self.result.seconds, 3),
            "bytes_hashed": self.result.bytes_hashed,
            "failed_ran": len(self.result.failed_ran),
            "failures": [{"label": label, "error": error,
                          "ran": label in self.result.failed_ran}
                         for label, error in self.result.failed.items()],
            "skipped_reasons": dict(self.result.skip_reasons),
            "cache_dir": str(self.store.directory), "cache_bytes": self.store.volume(),
        }
        if interrupted:
            summary["interrupted"] = True
        if self.result.remote is not None:
            summary["remote_cache_hits"] = len(self.result.remote_hits)
            summary["remote"] = self.result.remote
        if self.result.remote_execution is not None:
            summary["remote_execution"] = self.result.remote_execution
        self.reporter.build_finished(summary)
        self.session.registry.pm.hook.qbuild_build_finished(summary=summary)

    # -- scheduling ---------------------------------------------------------------------
    def _schedule(self, order: list[Label]) -> None:
        targets = self.graph.targets
        waiting = {label: len(set(targets[label].deps)) for label in order}
        dependents: dict[Label, list[Label]] = {label: [] for label in order}
        for label in order:
            for dep in set(targets[label].deps):
                dependents[dep].append(label)
        ready = deque(label for label in order if waiting[label] == 0)
        bad: set[Label] = set()
        stop = False
        running: dict[concurrent.futures.Future[Any], Label] = {}
        # Misses wait here until the cores and memory they need are free.
        queued: list[tuple[Label, Action, dict[str, Any], int]] = []
        grants: dict[Label, tuple[int, int]] = {}
        free = [self.cpu_budget, self.memory_budget]

        def finish(label: Label) -> None:
            for parent in dependents[label]:
                waiting[parent] -= 1
                if waiting[parent] == 0:
                    ready.append(parent)

        pool = None
        try:
            while ready or running or queued:
                while ready:
                    label = ready.popleft()
                    target = targets[label]
                    if any(dep in bad for dep in target.deps) or (stop and not target.is_group):
                        bad.add(label)
                        if not target.is_group:
                            self.result.skipped.append(str(label))
                            self.result.skip_reasons[str(label)] = self._skip_reason(target, bad)
                            self._event(label, "skipped", 0.0)
                        finish(label)
                        continue
                    if target.is_group:
                        finish(label)
                        continue
                    try:
                        parts, key, action = self.session.key_for(target, self.results)
                    except (OSError, QbuildError, RecursionError, ValueError) as exc:
                        self._failed(label, self._scrub(_one_line(exc)), "")
                        bad.add(label)
                        stop = stop or not self.options.keep_going
                        finish(label)
                        continue
                    self.actions[label] = action
                    if self.remote is not None:
                        cached, origin = self.remote.find_action(key)
                    else:
                        cached, origin = self.store.get_action(key), "local"
                    if cached is not None:
                        self._complete(label, key, cached, origin)
                        finish(label)
                        continue
                    if self.options.explain:
                        self._explain(label, parts)
                    assert target.rule is not None
                    cores, mib = target.rule.resources(target.attrs)
                    action.threads = max(1, min(int(cores), self.cpu_budget))
                    queued.append((label, action, parts, max(0, int(mib))))
                    self.reporter.action_queued(str(label))
                if stop:
                    for label, _, _, _ in queued:  # never started: skipped, like the rest
                        bad.add(label)
                        self.result.skipped.append(str(label))
                        self.result.skip_reasons[str(label)] = self._skip_reason(
                            targets[label], bad)
                        self._event(label, "skipped", 0.0)
                        finish(label)
                    queued.clear()
                    if ready:
                        continue
                for item in list(queued):
                    label, action, parts, mib = item
                    if running and (len(running) >= self.options.jobs
                                    or action.threads > free[0] or mib > free[1]):
                        continue  # waits for resources; one action always may run
                    queued.remove(item)
                    if pool is None:  # created on the first miss: no-op builds skip it
                        import concurrent.futures

                        pool = concurrent.futures.ThreadPoolExecutor(self.options.jobs)
                    future = pool.submit(self._run_action, label, action, parts)
                    running[future] = label
                    grants[label] = (action.threads, mib)
                    free[0] -= action.threads
                    free[1] -= mib
                if not running:
                    break
                import concurrent.futures

                done, _ = concurrent.futures.wait(running, return_when="FIRST_COMPLETED")
                for future in done:
                    label = running.pop(future)
                    cores_back, mib_back = grants.pop(label)
                    free[0] += cores_back
                    free[1] += mib_back
                    if not future.result():
                        bad.add(label)
                        stop = stop or not self.options.keep_going
                    finish(label)
        except BaseException:
            if pool is not None:  # interrupted: do not wait for running actions
                pool.shutdown(wait=False, cancel_futures=True)
                pool = None
            raise
        finally:
            if pool is not None:
                pool.shutdown(wait=True)

    def _skip_reason(self, target: Target, bad: set[Label]) -> str:
        failed = [dep for dep in target.deps if dep in bad]
        if not failed:
            return "not started: the build stops at the first failure (see --keep_going)"
        first = str(failed[0])
        return (f"depends on failed {first}" if first in self.result.failed
                else f"depends on skipped {first}")

    def _scrub(self, text: str) -> str:
        """Error text with sandbox paths written as the workspace-relative paths they
        stand for (sources are staged at those paths, outputs under qbuild-out/)."""
        for tmp in dict.fromkeys((str(self.store.tmp), os.path.realpath(self.store.tmp))):
            text = re.sub(re.escape(tmp) + r"/\d+-[0-9a-f]+/?", "", text)
        for root in dict.fromkeys((str(self.session.workspace.root),
                                   os.path.realpath(self.session.workspace.root))):
            text = text.replace(root + os.sep, "")
        return text

    def _run_action(self, label: Label, action: Action, parts: dict[str, Any]) -> bool:
        """Run one action in a job thread, reporting its start and end from that thread
        (so the next queued action never looks as if it started before this one ended).
        Returns False if it failed."""
        self.reporter.action_started(str(label))
        try:
            status, seconds = self._execute(label, action, parts)
        except ActionFailed as exc:
            with self._result_lock:
                self.result.failed_ran.append(str(label))
            self._failed(label, self._scrub(str(exc.error)), self._scrub(exc.log_tail))
            return False
        if status == "cached":  # another process ran it while this one waited
            self._complete(label, action.key, self.results[label], "local")
            return True
        with self._result_lock:
            self.result.ran.append(str(label))
        where = {"worker": self.workers[label]} if label in self.workers else {}
        self._event(label, "ran", seconds, origin="ran",
                    warnings=self.results[label].get("warnings", []),
                    rule=self.graph.targets[label].kind, **where)
        return True

    def _execute(self, label: Label, action: Action, parts: dict[str, Any]
                 ) -> tuple[str, float]:
        """Run one action: the boundary where anything the rule, the store or a worker
        raises becomes this label's failure. Returns ("ran" | "cached", seconds)."""
        try:
            return self._execute_unguarded(label, action, parts)
        except ActionFailed:
            raise
        except (QbuildError, OSError, RecursionError, MemoryError) as exc:
            raise ActionFailed(_one_line(exc)) from None
        except Exception as exc:
            raise ActionFailed(f"internal error: {_one_line(exc)} (rerun with --verbose "
                               "and report it)") from None

    def _execute_unguarded(self, label: Label, action: Action, parts: dict[str, Any]
                           ) -> tuple[str, float]:
        # One process runs a key at a time: a second one waits, then takes the hit.
        with self.store.action_lock(action.key):
            cached = self.store.get_action(action.key)
            if cached is not None:
                self.results[label] = cached
                return "cached", 0.0
            rebuilt: set[Label] = set()
            while True:
                try:
                    outcome = self.executor.execute(action)
                    break
                except MissingBlob as missing:
                    dep = _parse(missing.dep_label)
                    if dep in rebuilt:
                        raise ActionFailed(f"inputs of {label} could not be restored from "
                                           "the cache") from None
                    rebuilt.add(dep)
                    if self._rebuild(dep):  # a non-reproducible dep gave new bytes: re-key
                        parts, key, action = self.session.key_for(self.graph.targets[label],
                                                                  self.results)
                        self.actions[label] = action
                        return self._execute_unguarded(label, action, parts)
            result = {"outputs": outcome.outputs, "declared": action.outputs,
                      "info": outcome.info, "warnings": outcome.warnings}
            # Blobs are durable (stored and fsync'ed by the executor) before this commits.
            self.store.put_components(action.key, parts)
            self.session.save_code(parts)
            self._keep(label, action.key, result, outcome)
        self.results[label] = result
        self.state.set_last_key(str(label), action.key)
        self.result.infos[str(label)] = outcome.info
        return "ran", outcome.seconds

    def _keep(self, label: Label, key: str, result: dict[str, Any], outcome: Any) -> None:
        """Store a result; one a remote worker made is already on the cache server."""
        if outcome.worker:
            self.store.record(key, result)  # type: ignore[attr-defined]
            self.workers[label] = outcome.worker
        else:
            self.store.put_action(key, result)

    def _rebuild(self, label: Label) -> bool:
        """Run a cached action again because its stored outputs are gone or corrupt.

        Returns True if its outputs changed, which only a rule declared non-reproducible
        may do (its new result replaces the old one). Missing inputs of its own are
        rebuilt first, deepest first, with an explicit stack."""
        with self._rebuild_lock:
            stack = [label]
            rebuilt: set[Label] = set()
            rekeyed: set[Label] = set()  # inputs changed under it: new bytes are expected
            changed = False
            while stack:
                current = stack[-1]
                action = self.actions[current]
                try:
                    outcome = self.executor.execute(action)
                except MissingBlob as missing:
                    dep = _parse(missing.dep_label)
                    if dep in rebuilt or dep in stack:
                        raise ActionFailed(f"inputs of {current} could not be restored from "
                                           "the cache") from None
                    stack.append(dep)
                    continue
                stack.pop()
                rebuilt.add(current)
                old = {e["path"]: e["digest"] for e in self.results[current]["outputs"]}
                new = {e["path"]: e["digest"] for e in outcome.outputs}
                if old == new:
                    self.reporter.message(f"restored {current} by running it again (cached "
                                          "outputs were missing or corrupt)")
                    continue
                if self.results[current].get("origin") == "remote" and current not in rekeyed:
                    # Keep this machine's result under the key, so the next build uses it
                    # (and the remote entry, whose blobs were unusable, is replaced).
                    self.store.put_action(action.key, {
                        "outputs": outcome.outputs, "declared": action.outputs,
                        "info": outcome.info, "warnings": outcome.warnings})
                    raise ActionFailed(f"{current}: the remote cache's result could not be "
                                       "downloaded and running it here gave different bytes "
                                       "(the rule is not deterministic across machines); "
                                       "this machine's result is kept: run the build again")
                if action.reproducible and current not in rekeyed:
                    self.store.drop_action(action.key)
                    raise ActionFailed(f"{current} rebuilt to different bytes than its cached "
                                       "result (the rule is not deterministic; declare it "
                                       "non-reproducible); run the build again")
                result = {"outputs": outcome.outputs, "declared": action.outputs,
                          "info": outcome.info, "warnings": outcome.warnings}
                self._keep(current, action.key, result, outcome)
                self.results[current] = result
                self.state.set_last_key(str(current), action.key)
                self.result.infos[str(current)] = outcome.info
                if current == label:
                    changed = True
                elif stack:  # the parent was keyed with the old bytes: key it again
                    parent = stack[-1]
                    parts, _key, self.actions[parent] = self.session.key_for(
                        self.graph.targets[parent], self.results)
                    self.store.put_components(_key, parts)
                    rekeyed.add(parent)
            return changed

    def _complete(self, label: Label, key: str, result: dict[str, Any], origin: str) -> None:
        self.results[label] = result
        self.state.set_last_key(str(label), key)
        self.result.infos[str(label)] = result["info"]
        self.result.cached.append(str(label))
        if origin == "remote":
            self.result.remote_hits.append(str(label))
        self._event(label, "cached", 0.0, origin=f"{origin}_cache")

    def _failed(self, label: Label, error: str, log_tail: str) -> None:
        self.result.failed[str(label)] = error
        self._event(label, "failed", 0.0, error=error, log_tail=log_tail)

    def _event(self, label: Label, status: str, seconds: float, **extra: Any) -> None:
        event = {"label": str(label), "status": status, "seconds": round(seconds, 3), **extra}
        self.reporter.action_finished(event)
        self.session.registry.pm.hook.qbuild_action_finished(event=event)

    def _explain(self, label: Label, parts: dict[str, Any]) -> None:
        last = self.state.last_keys.get(str(label))
        old = self.store.get_components(last) if last else None
        lines = diff(old, parts, self.session.code_files) or [
            "no recorded difference (the cached result was removed)"]
        self.result.explanations[str(label)] = lines
        self.reporter.message(f"{label} will run: " + "; ".join(lines))

    # -- what the no-op fast path may rely on ----------------------------------------------
    def reads(self) -> dict[str, str | None] | None:
        """Every stat this build's result rests on, as taken when it was read (BUILD
        files, listed directories, sources as digested); None if one file was seen in
        two states."""
        loader_reads = self.graph.loader.reads
        if loader_reads.conflicting:
            return None
        stats = dict(loader_reads.stats)
        stats["qbuild.toml"] = self.session.workspace.marker_stat
        for action in self.actions.values():
            for rel, (_digest, key) in action.sources.items():
                if stats.setdefault(rel, key) != key:
                    return None
        return stats

    def placed_outputs(self) -> dict[str, str]:
        """Stats of the requested targets' files in the output folder, as placed."""
        workspace = self.session.workspace
        base = os.path.relpath(workspace.output_dir, workspace.root).replace(os.sep, "/")
        materialized = self.state.materialized
        return {f"{base}/{rel}": materialized[rel][1] for rel in self._placed
                if rel in materialized}

    # -- outputs ------------------------------------------------------------------------
    def _materialize(self, label: Label) -> None:
        """Place a requested target's outputs under qbuild-out as private read-only copies
        (executable where the rule made them so). If they cannot be placed even after
        running the action again, the target fails: a path is never printed for files
        that are not there."""
        base_rel = label_dir(str(label))
        output_dir = self.session.workspace.output_dir
        try:
            base = _real_dir(output_dir, base_rel)
            for attempt in range(2):
                result = self.results[label]
                # Each file is checked (no short cut), so every damaged blob is dropped
                # before the one rebuild.
                self._placed.update(f"{base_rel}/{e['path']}" for e in result["outputs"])
                placed = [self._place(base, f"{base_rel}/{e['path']}", e)
                          for e in result["outputs"]]
                if all(placed):
                    break
                if attempt == 1:
                    raise ActionFailed(f"the outputs of {label} could not be placed in "
                                       f"{output_dir.name}/{base_rel}")
                self._rebuild(label)
        except (ActionFailed, OSError) as exc:
            self._failed(label, str(getattr(exc, "error", None) or exc), "")
            _remove_owned(output_dir, base_rel)
            return
        wanted = {e["path"] for e in result["outputs"]}
        for directory, subdirs, files in os.walk(base, topdown=False):
            for name in files + [d for d in subdirs if os.path.islink(os.path.join(directory, d))]:
                path = Path(directory) / name
                rel = path.relative_to(base).as_posix()
                if rel not in wanted:
                    path.unlink()
                    self.state.set_materialized(f"{base_rel}/{rel}", None)
        self.result.outputs[str(label)] = [base / name.rstrip("/") for name in result["declared"]]

    def _place(self, base: Path, rel: str, entry: dict[str, Any]) -> bool:
        path = self.session.workspace.output_dir / rel
        digest, executable = entry["digest"], bool(entry.get("x"))
        _real_dir(base, str(Path(entry["path"]).parent))
        record = self.state.materialized.get(rel)
        try:
            st = os.lstat(path)
        except OSError:
            st = None
        if st is not None and stat.S_ISREG(st.st_mode) and record is not None and \
                record[0] == digest and record[2:] == [executable] and \
                bool(st.st_mode & stat.S_IXUSR) == executable and not st.st_mode & 0o222:
            if record[1] == stat_key(st):
                return True
            if hash_file(path) == digest:
                self.state.set_materialized(rel, [digest, stat_key(st), executable])
                return True
        if st is not None and stat.S_ISDIR(st.st_mode):
            _remove_owned(self.session.workspace.output_dir, rel)
        if not self.store.restore_blob(digest, path, executable):
            return False
        self.state.set_materialized(rel, [digest, stat_key(os.lstat(path)), executable])
        return True


def _real_dir(top: Path, rel: str) -> Path:
    """``top/rel`` as a real directory, made so without following any symlink below
    ``top``: a symlink or file in the way is removed (it is in qbuild's own folder), so
    qbuild never writes or deletes through a link out of it."""
    here = top
    here.mkdir(parents=True, exist_ok=True)
    for part in Path(rel).parts:
        if part in ("", "."):
            continue
        here = here / part
        try:
            st = os.lstat(here)
        except FileNotFoundError:
            _mkdir_shared(here)
            continue
        if not stat.S_ISDIR(st.st_mode):
            here.unlink(missing_ok=True)
            _mkdir_shared(here)
    return here


def _mkdir_shared(path: Path) -> None:
    """Make a folder another qbuild process may be making at the same moment."""
    try:
        path.mkdir()
    except FileExistsError:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            raise


def _remove_owned(top: Path, rel: str) -> None:
    """Delete ``top/rel`` (file, folder or symlink) without following symlinks."""
    here = top
    for part in Path(rel).parts[:-1]:
        here = here / part
        if here.is_symlink() or not here.is_dir():
            return  # what lies behind a link is not ours
    path = top / rel
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
