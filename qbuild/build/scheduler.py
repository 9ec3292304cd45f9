"""Driving a plan: ready targets are resolved (a cache hit finishes at once), misses
wait in a queue (critical path first) until ``-j`` and the core and memory budgets let
them start on an ``Executor``, and finished futures release their dependents.

The scheduler knows nothing of keys, stores or rules. It talks to two parties, each
through a declared protocol: the ``Executor`` runs actions, and the build's ``Targets``
answer for each target (``prepare`` a ready one: a hit, a failure or the action to run;
record a ``finished`` one; report a ``skipped`` one). It imports neither: the build
implements ``Targets`` (``build.outcomes.Outcomes``), as an executor implements
``Executor``. Waiting is ``concurrent.futures.wait`` unless an executor brings its own clock
(``qbuild.testing.FakeExecutor``), which makes scheduling tests exact.
"""

from __future__ import annotations

import bisect
import concurrent.futures
from collections.abc import Callable, Iterable
from typing import Protocol

from ..core.labels import Label
from ..core.protocols import Executor
from ..core.records import Outcome, TargetActions
from .plan import Plan

Futures = set[concurrent.futures.Future[Outcome]]


class Wait(Protocol):
    def __call__(self, fs: Iterable[concurrent.futures.Future[Outcome]], *,
                 return_when: str) -> tuple[Futures, Futures]: ...


def _wait(fs: Iterable[concurrent.futures.Future[Outcome]], *, return_when: str
          ) -> tuple[Futures, Futures]:
    done, pending = concurrent.futures.wait(fs, return_when=return_when)
    return set(done), set(pending)


class Targets(Protocol):
    """What the scheduler asks of the build about its targets."""

    def prepare(self, label: Label) -> TargetActions | bool:
        """Key a ready target and look it up: True (done: a hit), False (failed before
        running) or the ``TargetActions`` to run (``threads`` and ``memory_mib`` set: its
        grant)."""

    def queued(self, label: Label) -> None:
        """``label``'s action waits for a slot."""

    def finished(self, label: Label, future: concurrent.futures.Future[Outcome]) -> bool:
        """Record a finished action; did it succeed?"""

    def skipped(self, label: Label, failed_deps: list[Label]) -> None:
        """``label`` will not run (no failed dependencies: the build stopped)."""


class Scheduler:
    """Runs a ``Plan`` to its end on an ``Executor`` within the budgets, asking the
    build's ``Targets`` about each target."""

    def __init__(self, plan: Plan, executor: Executor, targets: Targets, *, jobs: int,
                 cpu: int, memory: int, keep_going: bool, wait: Wait | None = None) -> None:
        self.plan = plan
        self.executor = executor
        self.targets = targets
        self.jobs = max(1, jobs)
        self.cpu = max(1, cpu)
        self.memory = max(1, memory)
        self.keep_going = keep_going
        self.wait: Wait = wait or getattr(executor, "wait", None) or _wait

    def _resolve_ready(self, queue: list[tuple[Label, TargetActions]],
                       enough: Callable[[], bool] = lambda: False) -> None:
        """Prepare ready targets until none is left or ``enough()`` (asked before each)."""
        plan, targets, groups = self.plan, self.targets, self.plan.groups
        while plan.has_ready() and not enough():
            label = plan.pop_ready()
            group = label in groups
            if plan.blocked(label) or (plan.stopped and not group):
                if not group:
                    targets.skipped(label, plan.failed_deps(label))
                plan.finish(label, ok=False)
                continue
            if group:
                plan.finish(label)
                continue
            prepared = targets.prepare(label)
            if isinstance(prepared, bool):
                if not prepared and not self.keep_going and label not in plan.soft:
                    plan.stop()
                plan.finish(label, ok=prepared)
                continue
            # Kept in order as it grows (sorting it again for each finished action
            # was quadratic with thousands queued).
            bisect.insort(queue, (label, prepared), key=lambda item: plan.sort_key(item[0]))
            targets.queued(label)

    def run(self) -> None:
        plan = self.plan
        queue: list[tuple[Label, TargetActions]] = []  # misses waiting for a slot
        running: dict[concurrent.futures.Future[Outcome], tuple[int, Label, TargetActions]] = {}
        free_cpu, free_memory = self.cpu, self.memory
        started = 0

        def enough() -> bool:
            """Stop preparing (the rest is prepared while actions run) when an action
            finished, or when the queue's head fills every free slot exactly as it would
            with every ready target prepared: those actions fit the free resources and
            come before every target still to prepare. (Keying 10,000 ready targets
            before the first action started left the other threads idle for seconds.)"""
            free = self.jobs - len(running)
            if free <= 0:
                return any(future.done() for future in running)
            if len(queue) < free:
                return False
            if plan.has_ready() and \
                    plan.sort_key(queue[free - 1][0]) > plan.next_sort_key():
                return False
            cpu, memory = free_cpu, free_memory
            for index, (_label, action) in enumerate(queue[:free]):
                if (index or running) and (action.threads > cpu or action.memory_mib > memory):
                    return False  # the full queue might hold one that fits instead
                cpu -= action.threads
                memory -= action.memory_mib
            return True

        while plan.has_ready() or running or queue:
            self._resolve_ready(queue, enough)
            if plan.stopped and queue:
                for label, _action in queue:  # never started: skipped, like the rest
                    self.targets.skipped(label, [])
                    plan.finish(label, ok=False)
                queue.clear()
                if plan.has_ready():
                    continue
            # Scanned only while a slot is free (no walk of a long queue per finished
            # action once every slot is taken again: that was quadratic).
            index = 0
            while index < len(queue) and len(running) < self.jobs:
                label, action = queue[index]
                if running and (action.threads > free_cpu
                                or action.memory_mib > free_memory):
                    index += 1
                    continue  # waits for resources; one action always may run
                del queue[index]
                future = self.executor.submit(action)
                running[future] = (started, label, action)
                started += 1
                free_cpu -= action.threads
                free_memory -= action.memory_mib
            if not running:
                break
            if plan.has_ready() and not any(future.done() for future in running):
                continue  # more to key while these run
            done, _ = self.wait(running, return_when=concurrent.futures.FIRST_COMPLETED)
            for future in sorted(done, key=lambda f: running[f][0]):
                _seq, label, action = running.pop(future)
                free_cpu += action.threads
                free_memory += action.memory_mib
                ok = self.targets.finished(label, future)
                if not ok and not self.keep_going and label not in plan.soft:
                    plan.stop()
                plan.finish(label, ok=ok)
