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

    from ._remote_http import RemoteConfig
    from ._remote_store import LayeredStore


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
    remote_hits: list[str] = field(default_factory=list)
    remote: dict[str, Any] | None = None
    failed: dict[str, str] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
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
        # The remote layer, when configured (imported only then: it pulls in http.client).
        self.remote: LayeredStore | None = None
        if session.remote is not None:
            self.remote = self.store  # type: ignore[assignment]
            self.remote.warn = reporter.message
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
        self.result.remote = self.remote.summary() if self.remote is not None else None
        self.result.seconds = time.monotonic() - started
        summary = {
            "ok": self.result.ok, "targets": len(requested), "actions_run": len(self.result.ran),
            "cache_hits": len(self.result.cached), "failed": len(self.result.failed),
            "skipped": len(self.result.skipped), "seconds": round(self.result.seconds, 3),
            "bytes_hashed": self.result.bytes_hashed,
        }
        if self.result.remote is not None:
            summary["remote_cache_hits"] = len(self.result.remote_hits)
            summary["remote"] = self.result.remote
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
                            self._event(label, "skipped", 0.0)
                        finish(label)
                        continue
                    if target.is_group:
                        finish(label)
                        continue
                    try:
                        parts, key, action = self.session.key_for(target, self.results)
                    except (OSError, QbuildError) as exc:
                        self._failed(label, str(exc), "")
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
                        outcome_seconds = future.result()
                    except ActionFailed as exc:
                        self._failed(label, str(exc.error), exc.log_tail)
                        bad.add(label)
                        stop = stop or not self.options.keep_going
                    else:
                        self.result.ran.append(str(label))
                        self._event(label, "ran", outcome_seconds, origin="ran",
                                    warnings=self.results[label].get("warnings", []))
                    finish(label)
        finally:
            if pool is not None:
                pool.shutdown(wait=True)

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
                if self.results[label].get("origin") == "remote":
                    # Keep this machine's result under the key, so the next build uses it
                    # (and the remote entry, whose blobs were unusable, is replaced).
                    self.store.put_action(action.key, {
                        "outputs": outcome.outputs, "declared": action.outputs,
                        "info": outcome.info, "warnings": outcome.warnings})
                    raise ActionFailed(f"{label}: the remote cache's result could not be "
                                       "downloaded and running it here gave different bytes "
                                       "(the rule is not deterministic across machines); "
                                       "this machine's result is kept: run the build again")
                self.store.drop_action(action.key)
                raise ActionFailed(f"{label} rebuilt to different bytes than its cached result "
                                   "(the rule is not deterministic); run the build again")
            self.reporter.message(f"restored {label} by running it again (cached outputs were "
                                  "missing or corrupt)")

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
