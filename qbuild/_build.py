"""The build: schedule analysed targets in dependency order, serve hits from the action
cache, run misses in parallel, store results, and materialize requested outputs.

Scheduling is topological (BUILD dependencies are static); rebuilding follows a
constructive trace: an action's key is computed from its inputs' content, so a
dependency rebuilt to identical bytes gives the same key and stops the rebuild there
(early cutoff).
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._analysis import Graph, Target
from ._digest import SourceDigests, hash_file, stat_key
from ._errors import QbuildError
from ._executor import Action, ActionFailed, LocalExecutor, MissingBlob, label_dir
from ._keys import action_key, components, diff
from ._label import Label
from ._plugins import Registry
from ._progress import Reporter
from ._state import WorkspaceState
from ._store import LocalStore
from ._workspace import Workspace

if TYPE_CHECKING:
    import concurrent.futures


@dataclass
class BuildOptions:
    jobs: int = 1
    keep_going: bool = False
    explain: bool = False


@dataclass
class BuildResult:
    """What a build did; the testing helpers and the CLI read it."""

    ok: bool = True
    requested: list[str] = field(default_factory=list)
    ran: list[str] = field(default_factory=list)
    cached: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    outputs: dict[str, list[Path]] = field(default_factory=dict)
    infos: dict[str, dict[str, Any]] = field(default_factory=dict)
    explanations: dict[str, list[str]] = field(default_factory=dict)
    bytes_hashed: int = 0
    seconds: float = 0.0


class Session:
    """The engine objects one command works with."""

    def __init__(self, workspace: Workspace, registry: Registry) -> None:
        self.workspace = workspace
        self.registry = registry
        self.graph = Graph(workspace, registry)
        self._store: LocalStore | None = None
        self._digests: SourceDigests | None = None

    @property
    def store(self) -> LocalStore:
        if self._store is None:
            self._store = LocalStore(self.workspace.cache_dir)
        return self._store

    @property
    def digests(self) -> SourceDigests:
        if self._digests is None:
            self._digests = SourceDigests(self.store)
        return self._digests

    def close(self) -> None:
        if self._store is not None:
            self._store.close()

    def key_for(self, target: Target, results: dict[Label, dict[str, Any]]
                ) -> tuple[dict[str, Any], str, Action]:
        """Key components, key and runnable action of ``target`` given its deps' results."""
        root = self.workspace.root
        sources = {rel: self.digests.digest(root / rel) for rel in target.sources}
        deps = {}
        for dep in target.deps:
            result = results[dep]
            deps[str(dep)] = {"outputs": result["outputs"], "declared": result["declared"],
                              "info": result["info"]}
        parts = components(target, {rel: d for rel, (d, _) in sources.items()}, deps)
        key = action_key(parts)
        assert target.entry is not None and target.rule is not None
        action = Action(
            label=str(target.label), build_file=target.build_file, rule_ref=target.entry.ref,
            heavy=bool(target.rule.heavy), attrs=target.attrs,
            attr_types={name: schema.type for name, schema in target.rule.attrs.items()},
            sources=sources, deps=deps, outputs=target.outputs, key=key,
            reproducible=target.rule.is_reproducible(target.attrs),
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
        self.state = WorkspaceState(session.workspace.output_dir)
        self.results: dict[Label, dict[str, Any]] = {}
        self.actions: dict[Label, Action] = {}
        self.result = BuildResult()
        self._rebuild_lock = threading.RLock()
        self._placed: set[str] = set()  # output-folder paths of the requested targets
        self.executor = LocalExecutor(self.store, session.workspace.root, session.digests,
                                      options.jobs)

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
                        shutil.rmtree(self.session.workspace.output_dir /
                                      label_dir(str(label)), ignore_errors=True)
                        self.result.outputs.pop(str(label), None)
                else:
                    shutil.rmtree(self.session.workspace.output_dir / label_dir(str(label)),
                                  ignore_errors=True)
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
        self.result.seconds = time.monotonic() - started
        summary = {
            "ok": self.result.ok, "targets": len(requested), "actions_run": len(self.result.ran),
            "cache_hits": len(self.result.cached), "failed": len(self.result.failed),
            "skipped": len(self.result.skipped), "seconds": round(self.result.seconds, 3),
            "bytes_hashed": self.result.bytes_hashed,
        }
        if interrupted:
            summary["interrupted"] = True
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

        def finish(label: Label) -> None:
            for parent in dependents[label]:
                waiting[parent] -= 1
                if waiting[parent] == 0:
                    ready.append(parent)

        pool = None
        try:
            while ready or running:
                while ready:
                    label = ready.popleft()
                    target = targets[label]
                    if any(dep in bad for dep in target.deps) or (stop and not target.is_group):
                        bad.add(label)
                        if not target.is_group:
                            self.result.skipped.append(str(label))
                            self._event(label, "skipped", 0.0)
                        finish(label)
                        continue
                    if target.is_group:
                        finish(label)
                        continue
                    try:
                        parts, key, action = self.session.key_for(target, self.results)
                    except (OSError, QbuildError, RecursionError, ValueError) as exc:
                        self._failed(label, _one_line(exc), "")
                        bad.add(label)
                        stop = stop or not self.options.keep_going
                        finish(label)
                        continue
                    self.actions[label] = action
                    cached = self.store.get_action(key)
                    if cached is not None:
                        self._complete(label, key, cached, "cached", 0.0)
                        finish(label)
                        continue
                    if self.options.explain:
                        self._explain(label, parts)
                    self.reporter.action_started(str(label))
                    if pool is None:  # created on the first miss: no-op builds skip it
                        import concurrent.futures

                        pool = concurrent.futures.ThreadPoolExecutor(self.options.jobs)
                    future = pool.submit(self._execute, label, action, parts)
                    running[future] = label
                if not running:
                    break
                import concurrent.futures

                done, _ = concurrent.futures.wait(running, return_when="FIRST_COMPLETED")
                for future in done:
                    label = running.pop(future)
                    try:
                        status, outcome_seconds = future.result()
                    except ActionFailed as exc:
                        self._failed(label, str(exc.error), exc.log_tail)
                        bad.add(label)
                        stop = stop or not self.options.keep_going
                    else:
                        if status == "ran":
                            self.result.ran.append(str(label))
                            self._event(label, "ran", outcome_seconds,
                                        warnings=self.results[label].get("warnings", []))
                        else:
                            self._complete(label, self.actions[label].key, self.results[label],
                                           "cached", 0.0)
                    finish(label)
        except BaseException:
            if pool is not None:  # interrupted: do not wait for running actions
                pool.shutdown(wait=False, cancel_futures=True)
                pool = None
            raise
        finally:
            if pool is not None:
                pool.shutdown(wait=True)

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
            self.store.put_result(action.key, parts, result)
        self.results[label] = result
        self.state.set_last_key(str(label), action.key)
        self.result.infos[str(label)] = outcome.info
        return "ran", outcome.seconds

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
                if action.reproducible and current not in rekeyed:
                    self.store.drop_action(action.key)
                    raise ActionFailed(f"{current} rebuilt to different bytes than its cached "
                                       "result (the rule is not deterministic; declare it "
                                       "non-reproducible); run the build again")
                result = {"outputs": outcome.outputs, "declared": action.outputs,
                          "info": outcome.info, "warnings": outcome.warnings}
                self.store.put_action(action.key, result)
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

    def _complete(self, label: Label, key: str, result: dict[str, Any], status: str,
                  seconds: float) -> None:
        self.results[label] = result
        self.state.set_last_key(str(label), key)
        self.result.infos[str(label)] = result["info"]
        self.result.cached.append(str(label))
        self._event(label, status, seconds)

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
        lines = diff(old, parts) or ["no recorded difference (the cached result was removed)"]
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
        result = self.results[label]
        base_rel = label_dir(str(label))
        base = self.session.workspace.output_dir / base_rel
        wanted = {e["path"] for e in result["outputs"]}
        if not self._place_all(label):
            self._rebuild(label)  # every damaged blob of the target was dropped above
            result = self.results[label]
            wanted = {e["path"] for e in result["outputs"]}
            if not self._place_all(label):
                raise ActionFailed(f"the outputs of {label} could not be restored from the "
                                   "cache")
        prefix = len(str(base)) + 1
        for directory, _dirs, files in os.walk(base):  # files no longer declared go
            for name in files:
                path = os.path.join(directory, name)
                rel = path[prefix:].replace(os.sep, "/")
                if rel not in wanted:
                    os.unlink(path)
                    self.state.set_materialized(f"{base_rel}/{rel}", None)
        self.result.outputs[str(label)] = [base / name.rstrip("/") for name in result["declared"]]

    def _place_all(self, label: Label) -> bool:
        base_rel = label_dir(str(label))
        rels = [f"{base_rel}/{e['path']}" for e in self.results[label]["outputs"]]
        self._placed.update(rels)
        placed = [self._place(rel, e["digest"])  # each one checked, no short cut
                  for rel, e in zip(rels, self.results[label]["outputs"])]
        return all(placed)

    def _place(self, rel: str, digest: str) -> bool:
        path = self.session.workspace.output_dir / rel
        record = self.state.materialized.get(rel)
        try:
            st = os.lstat(path)
        except OSError:
            st = None
        if st is not None and record is not None and record[0] == digest:
            if record[1] == stat_key(st):
                return True
            if hash_file(path) == digest:
                self.state.set_materialized(rel, [digest, stat_key(st)])
                return True
        if not self.store.restore_blob(digest, path):
            return False
        self.state.set_materialized(rel, [digest, stat_key(os.lstat(path))])
        return True
