"""The rebuilder: a target's key, a hit or a miss, running the miss, storing its result.

Rebuilding follows a constructive trace: an action's key is computed from its inputs'
content, so a dependency rebuilt to identical bytes gives the same key and stops the
rebuild there (early cutoff). One process runs a key at a time (a second waits, then
takes the hit). A dependency whose stored outputs turn out missing or corrupt is run
again (``rebuild``); a rule declared non-reproducible may then give new bytes, and its
dependents are keyed again.

``Rebuilder`` is itself an ``Executor`` for the scheduler: ``submit`` runs a miss (lock,
recheck, execute on the real executor, store) in one of ``jobs`` threads.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import queue
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

from ..analysis.graph import Graph, Target
from ..core.errors import QbuildError
from ..core.labels import Label
from ..core.protocols import Executor, HeldLock, Origin, Store
from ..core.records import ActionResult, KeyParts, Outcome, TargetActions
from ..execution.failures import ActionFailed, MissingBlob
from ..keys.keyer import Keyer
from .state import WorkspaceState


def one_line(exc: BaseException) -> str:
    """An exception as the one line a user sees."""
    if isinstance(exc, QbuildError):
        return str(exc)
    if isinstance(exc, OSError) and exc.strerror:
        where = f" ({exc.filename})" if exc.filename else ""
        return f"{exc.strerror}{where}"
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class Rebuilder:
    """Keys, cache lookups, runs and stores for one build; holds every target's result."""

    def __init__(self, keyer: Keyer, graph: Graph, store: Store, root: Path,
                 executor: Executor, state: WorkspaceState,
                 jobs: int, started: Callable[[str], None] = lambda _label: None,
                 message: Callable[[str], None] = lambda _text: None) -> None:
        self.keyer = keyer
        self.graph = graph
        self.root = root
        self.store = store
        self.executor = executor
        self.state = state
        self.jobs = jobs
        self.started = started
        self.message = message
        self.results: dict[Label, ActionResult] = {}
        self.actions: dict[Label, TargetActions] = {}
        self.parts: dict[Label, KeyParts] = {}
        # sources of every keyed or reused target, as digested: {rel: (digest, stat)}
        self.sources: dict[Label, Mapping[str, tuple[str, str]]] = {}
        self.rebuilt = False  # an action was run again to restore its outputs
        # Batched commits of action entries (a store that can defer its fsyncs; a remote
        # layer uploads each entry itself).
        self.committer: Committer | None = None
        if self.store.defer_sync():
            self.committer = Committer(self.store, keyer.save_code, message)
        self._rebuild_lock = threading.RLock()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        # Called in the action's thread with each new result once it is recorded (the
        # build places requested outputs there, while other actions run).
        self.ran: Callable[[Label, ActionResult], None] = lambda _label, _result: None

    # -- key, hit or miss --------------------------------------------------------------
    def lookup(self, target: Target) -> tuple[TargetActions, ActionResult | None, Origin]:
        """Key ``target`` from its dependencies' results and look the key up."""
        parts, key, action = self.keyer.keyed(target, self.results, with_parts=False)
        self.actions[target.label] = action
        self.sources[target.label] = action.sources
        cached, origin = self.store.find_action(key)
        if cached is None and parts is None:  # a miss: the parts are recorded with it
            parts = self.keyer.parts_of(target, action)
        if parts is not None:
            self.parts[target.label] = parts
        return action, cached, origin

    def hit(self, label: Label, key: str, result: ActionResult) -> None:
        self.results[label] = result
        self.state.set_last_key(str(label), key)

    def reuse(self, label: Label, key: str, result: ActionResult,
              sources: dict[str, tuple[str, str]]) -> None:
        """The last build's key and result, unchanged (``_incremental``): no action
        record is made unless the target has to run again (``_action``)."""
        self.sources[label] = sources
        for rel, (digest, stat) in sources.items():
            self.keyer.digests.vouch(self.root / rel, digest, stat)
        self.hit(label, key, result)

    def _action(self, label: Label) -> TargetActions:
        action = self.actions.get(label)
        if action is None:  # a reused target: key it now
            parts, _key, action = self.keyer.key_for(self.graph.targets[label],
                                                       self.results)
            self.actions[label], self.parts[label] = action, parts
        return action

    # -- running misses (the scheduler's executor) --------------------------------------
    def submit(self, action: TargetActions) -> concurrent.futures.Future[Outcome]:
        if self._pool is None:  # created on the first miss: no-op builds skip it
            self._pool = concurrent.futures.ThreadPoolExecutor(self.jobs)
        return self._pool.submit(self.run, action)

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        self.executor.close()
        if self.committer is not None:
            self.committer.close()

    def kill(self) -> None:
        """Interrupted: do not wait for running actions."""
        pool, self._pool = self._pool, None
        self.executor.kill()
        if self.committer is not None:
            self.committer.close()  # what is queued is a few quick writes
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def run(self, action: TargetActions) -> Outcome:
        """Run one miss: the boundary where anything the rule, the store or a worker
        raises becomes this label's ``ActionFailed``."""
        self.started(str(action.label))
        try:
            return self._run(action)
        except ActionFailed:
            raise
        except (QbuildError, OSError, RecursionError, MemoryError) as exc:
            raise ActionFailed(one_line(exc)) from None
        except Exception as exc:
            raise ActionFailed(f"internal error: {one_line(exc)} (rerun with --verbose "
                               "and report it)") from None

    def _run(self, action: TargetActions) -> Outcome:
        label = action.label
        # One process runs a key at a time: a second one waits, then takes the hit.
        with contextlib.ExitStack() as stack:
            lock = self.store.lock_action(action.key)
            if lock is not None:
                stack.callback(lock.release)
            outcome, retry = self._run_locked(action)
            if outcome is not None and outcome.status != "cached":
                parts = self.parts[label]
                if lock is not None and self.committer is not None:
                    # Committed off the critical path, with others, after their blobs
                    # are durable; the lock is released only then, so another process
                    # waiting for this key finds the entry.
                    stack.pop_all()
                    self.committer.put(lock, action.key, parts, outcome.result)
                else:
                    # Blobs are durable (stored and fsync'ed by the executor) first.
                    self.store.put_components(action.key, parts)
                    self.keyer.save_code(parts)
                    self.store.put_action(action.key, outcome.result)
        if retry is not None:
            return self._run(retry)
        assert outcome is not None
        if outcome.status != "cached":
            self.results[label] = outcome.result
            self.state.set_last_key(str(label), action.key)
            self.ran(label, outcome.result)
        return outcome

    def _run_locked(self, action: TargetActions) -> tuple[Outcome | None, TargetActions | None]:
        """(the outcome, None), or (None, the action keyed again) when a rebuilt
        dependency gave new bytes."""
        label = action.label
        cached = self.store.get_action(action.key)
        if cached is not None:
            self.hit(label, action.key, cached)
            return Outcome(cached, 0.0, "cached"), None
        rebuilt: set[Label] = set()
        while True:
            try:
                return self.executor.submit(action).result(), None
            except MissingBlob as missing:
                dep = self._dep(label, missing.dep_label)
                if dep in rebuilt:
                    raise ActionFailed(f"inputs of {label} could not be restored from "
                                       "the cache", started=False) from None
                rebuilt.add(dep)
                if self.rebuild(dep):  # a non-reproducible dep gave new bytes: re-key
                    target = self.graph.targets[label]
                    parts, _key, fresh = self.keyer.key_for(target, self.results)
                    self.actions[label], self.parts[label] = fresh, parts
                    return None, _granted(fresh, action)

    def _dep(self, label: Label, text: str) -> Label:
        for dep in self.graph.targets[label].deps:
            if str(dep) == text:
                return dep
        raise ActionFailed(f"inputs of {label} could not be restored from the cache",
                           started=False)

    def rebuild(self, label: Label) -> bool:
        """Run a cached action again because its stored outputs are gone or corrupt.

        Returns True if its outputs changed, which only a rule declared non-reproducible
        may do (its new result replaces the old one). Missing inputs of its own are
        rebuilt first, deepest first, with an explicit stack."""
        with self._rebuild_lock:
            self.rebuilt = True
            stack = [label]
            rebuilt: set[Label] = set()
            rekeyed: set[Label] = set()  # inputs changed under it: new bytes are expected
            changed = False
            while stack:
                current = stack[-1]
                action = self._action(current)
                try:
                    outcome = self.executor.submit(action).result()
                except MissingBlob as missing:
                    dep = self._dep(current, missing.dep_label)
                    if dep in rebuilt or dep in stack:
                        raise ActionFailed(f"inputs of {current} could not be restored from "
                                           "the cache", started=False) from None
                    stack.append(dep)
                    continue
                stack.pop()
                rebuilt.add(current)
                if self.results[current].digests() == outcome.result.digests():
                    self.message(f"restored {current} by running it again (cached outputs "
                                 "were missing or corrupt)")
                    continue
                if self.results[current].origin == "remote" and current not in rekeyed:
                    # Keep this machine's result under the key, so the next build uses it
                    # (and the remote entry, whose blobs were unusable, is replaced).
                    self.store.put_action(action.key, outcome.result)
                    raise ActionFailed(f"{current}: the remote cache's result could not be "
                                       "downloaded and running it here gave different bytes "
                                       "(the rule is not deterministic across machines); "
                                       "this machine's result is kept: run the build again")
                if action.reproducible and current not in rekeyed:
                    self.store.drop_action(action.key)
                    raise ActionFailed(f"{current} rebuilt to different bytes than its cached "
                                       "result (the rule is not deterministic; declare it "
                                       "non-reproducible); run the build again")
                self.store.put_action(action.key, outcome.result)
                self.results[current] = outcome.result
                self.state.set_last_key(str(current), action.key)
                if current == label:
                    changed = True
                elif stack:  # the parent was keyed with the old bytes: key it again
                    parent = stack[-1]
                    parts, key, fresh = self.keyer.key_for(
                        self.graph.targets[parent], self.results)
                    self.actions[parent] = _granted(fresh, self._action(parent))
                    self.parts[parent] = parts
                    self.store.put_components(key, parts)
                    rekeyed.add(parent)
            return changed


def _granted(fresh: TargetActions, old: TargetActions) -> TargetActions:
    """``fresh`` with the resources the scheduler granted ``old``."""
    from dataclasses import replace

    return replace(fresh, threads=old.threads, memory_mib=old.memory_mib)


class Committer:
    """Writes action entries in batches in a thread of its own: one fsync pass over the
    blobs stored since the last batch, then one transaction for the batch's key parts
    and results; only then are the entries' locks released. The build waits for it to
    finish (``close``) before it records anything that relies on those entries."""

    def __init__(self, store: Store, save_code: Callable[[KeyParts], None],
                 message: Callable[[str], None]) -> None:
        self.store = store
        self.save_code = save_code
        self.message = message
        self.errors: list[str] = []
        self._queue: queue.SimpleQueue[tuple[HeldLock, str, KeyParts, ActionResult] | None] = \
            queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start = threading.Lock()

    def put(self, lock: HeldLock, key: str, parts: KeyParts, result: ActionResult) -> None:
        with self._start:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="qbuild-commit",
                                                daemon=True)
                self._thread.start()
        self._queue.put((lock, key, parts, result))

    def close(self) -> None:
        with self._start:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join()

    def _run(self) -> None:
        done = False
        while not done:
            first = self._queue.get()
            batch = []
            if first is None:
                done = True
            else:
                batch.append(first)
            while not done and len(batch) < 256:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    done = True
                else:
                    batch.append(item)
            if batch:
                self._commit(batch)

    def _commit(self, batch: list[tuple[HeldLock, str, KeyParts, ActionResult]]) -> None:
        try:
            self.store.put_results(
                [(key, parts, result) for _lock, key, parts, result in batch])
            for _lock, _key, parts, _result in batch:
                self.save_code(parts)
        except Exception as exc:  # noqa: BLE001 - only costs running them again
            error = one_line(exc)
            self.errors.append(error)
            self.message(f"could not record {len(batch)} result(s) in the cache: {error}")
        finally:
            for lock, *_rest in batch:
                lock.release()
