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
    failed_ran: list[str] = field(default_factory=list)  # failed while running (not before)
    skip_reasons: dict[str, str] = field(default_factory=dict)
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
        )
        return parts, key, action


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
        self._result_lock = threading.Lock()  # job threads record their outcomes
        self.executor = LocalExecutor(self.store, session.workspace.root, session.digests,
                                      options.jobs)

    def run(self, roots: list[Label]) -> BuildResult:
        started = time.monotonic()
        order = self.graph.analyze(roots)
        requested = _expand_groups(self.graph, roots)
        self.result.requested = [str(x) for x in requested]
        actionable = [x for x in order if not self.graph.targets[x].is_group]
        self.reporter.build_started(len(actionable))
        try:
            self._schedule(order)
            for label in requested:
                if label in self.results:
                    self._materialize(label)
                else:
                    shutil.rmtree(self.session.workspace.output_dir / label_dir(str(label)),
                                  ignore_errors=True)
        finally:
            self.executor.close()
            self.state.save()
        self.result.ok = not self.result.failed and not self.result.skipped
        self.result.bytes_hashed = self.session.digests.bytes_hashed
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
        self.reporter.build_finished(summary)
        self.session.registry.pm.hook.qbuild_build_finished(summary=summary)
        return self.result

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
                            self.result.skip_reasons[str(label)] = self._skip_reason(target, bad)
                            self._event(label, "skipped", 0.0)
                        finish(label)
                        continue
                    if target.is_group:
                        finish(label)
                        continue
                    try:
                        parts, key, action = self.session.key_for(target, self.results)
                    except (OSError, QbuildError) as exc:
                        self._failed(label, self._scrub(str(exc)), "")
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
                    self.reporter.action_queued(str(label))
                    if pool is None:  # created on the first miss: no-op builds skip it
                        import concurrent.futures

                        pool = concurrent.futures.ThreadPoolExecutor(self.options.jobs)
                    future = pool.submit(self._run_action, label, action, parts)
                    running[future] = label
                if not running:
                    break
                import concurrent.futures

                done, _ = concurrent.futures.wait(running, return_when="FIRST_COMPLETED")
                for future in done:
                    label = running.pop(future)
                    if not future.result():
                        bad.add(label)
                        stop = stop or not self.options.keep_going
                    finish(label)
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
        (so the next queued action never looks as if it started before this one ended)."""
        self.reporter.action_started(str(label))
        try:
            seconds = self._execute(label, action, parts)
        except ActionFailed as exc:
            with self._result_lock:
                self.result.failed_ran.append(str(label))
            self._failed(label, self._scrub(str(exc.error)), self._scrub(exc.log_tail))
            return False
        with self._result_lock:
            self.result.ran.append(str(label))
        self._event(label, "ran", seconds, warnings=self.results[label].get("warnings", []),
                    rule=self.graph.targets[label].kind)
        return True

    def _execute(self, label: Label, action: Action, parts: dict[str, Any]) -> float:
        for _attempt in range(3):
            try:
                outcome = self.executor.execute(action)
                break
            except MissingBlob as missing:
                self._rebuild(Label(*missing.dep_label[2:].split(":", 1)))
        else:
            raise ActionFailed(f"inputs of {label} could not be restored from the cache")
        result = {"outputs": outcome.outputs, "declared": action.outputs, "info": outcome.info,
                  "warnings": outcome.warnings}
        self.store.put_components(action.key, parts)
        self.store.put_action(action.key, result)
        self.results[label] = result
        self.state.set_last_key(str(label), action.key)
        self.result.infos[str(label)] = outcome.info
        return outcome.seconds

    def _rebuild(self, label: Label) -> None:
        """Run a cached action again because its stored outputs are gone or corrupt."""
        with self._rebuild_lock:
            action = self.actions[label]
            while True:
                try:
                    outcome = self.executor.execute(action)
                    break
                except MissingBlob as missing:  # its own inputs are gone too: go deeper
                    self._rebuild(Label(*missing.dep_label[2:].split(":", 1)))
            old = {e["path"]: e["digest"] for e in self.results[label]["outputs"]}
            new = {e["path"]: e["digest"] for e in outcome.outputs}
            if old != new:
                self.store.drop_action(action.key)
                raise ActionFailed(f"{label} rebuilt to different bytes than its cached result "
                                   "(the rule is not deterministic); run the build again")
            self.reporter.message(f"restored {label} by running it again (cached outputs were "
                                  "missing or corrupt)")

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

    # -- outputs ------------------------------------------------------------------------
    def _materialize(self, label: Label) -> None:
        result = self.results[label]
        base_rel = label_dir(str(label))
        base = self.session.workspace.output_dir / base_rel
        wanted = {e["path"] for e in result["outputs"]}
        for attempt in range(2):
            ok = all(self._place(f"{base_rel}/{e['path']}", e["digest"])
                     for e in result["outputs"])
            if ok:
                break
            if attempt == 0:
                self._rebuild(label)
        if base.is_dir():
            for path in sorted(base.rglob("*"), reverse=True):
                rel = path.relative_to(base).as_posix()
                if path.is_file() and rel not in wanted:
                    path.unlink()
                    self.state.set_materialized(f"{base_rel}/{rel}", None)
        self.result.outputs[str(label)] = [base / name.rstrip("/") for name in result["declared"]]

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
