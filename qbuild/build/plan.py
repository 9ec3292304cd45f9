"""The plan of a build: which targets may start, in which order, and which are skipped.

Pure bookkeeping, no I/O (ninja's ``Plan``): each target waits for a count of
unfinished dependencies; a finished target releases its dependents. Ready targets come
out critical path first: the one with the longest chain of actions still to run
behind it, so long chains start early and short branches fill the gaps (ties in
analysis order, so a plan is deterministic). A failed target makes everything that
depends on it skipped; after a failure without ``keep_going`` the plan stops and every
action not yet started is skipped too.

Except where a dependent tolerates it (``attr.label(tolerate_failures=True)``): the
dependent is then not blocked by that dependency. A target is *soft* when the user did
not ask for it and each of its dependents either tolerates it or is soft itself: its
failure fails nothing anyone asked for, so the plan does not stop for it and the build
still succeeds (``Build`` reports it as tolerated).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence

from ..core.labels import Label


class Plan:
    """Waiting counts, a ready queue ordered critical path first, and the skip set."""

    def __init__(self, order: Sequence[Label], deps: Mapping[Label, Iterable[Label]],
                 groups: Iterable[Label] = (),
                 tolerant: Mapping[Label, Iterable[Label]] | None = None,
                 requested: Iterable[Label] = ()) -> None:
        """``order``: every target, dependencies first (analysis order); ``groups``: the
        targets that run nothing (done once their dependencies are; no cost on the
        critical path); ``tolerant``: per target, the dependencies whose failure it
        accepts; ``requested``: what the user asked for (never soft)."""
        self.groups = frozenset(groups)
        self._index = {label: i for i, label in enumerate(order)}
        self.deps = {label: list(dict.fromkeys(deps[label])) for label in order}
        self.tolerant = {label: frozenset(ds) for label, ds in (tolerant or {}).items()}
        dependents: dict[Label, list[Label]] = {label: [] for label in order}
        for label, before in self.deps.items():
            for dep in before:
                dependents[dep].append(label)
        self._dependents = dependents
        asked = set(requested)
        self.soft: set[Label] = set()
        if self.tolerant:  # (no target tolerates a failure: nothing is soft)
            for label in reversed(order):  # dependents before their dependencies
                users = dependents[label]
                if label not in asked and users and all(
                        u in self.soft or label in self.tolerant.get(u, ()) for u in users):
                    self.soft.add(label)
        self._waiting = {label: len(before) for label, before in self.deps.items()}
        # Length of the longest chain from each target to the end of the build.
        priority: dict[Label, int] = {}
        groups = self.groups
        for label in reversed(order):
            after = 0
            for parent in dependents[label]:
                if priority[parent] > after:
                    after = priority[parent]
            priority[label] = after if label in groups else after + 1
        self.priority = priority
        self._ready: list[tuple[int, int, Label]] = []
        for label in order:
            if self._waiting[label] == 0:
                self._push(label)
        self.bad: set[Label] = set()  # failed or skipped
        self.stopped = False

    def _push(self, label: Label) -> None:
        heapq.heappush(self._ready, (-self.priority[label], self._index[label], label))

    def sort_key(self, label: Label) -> tuple[int, int]:
        """Critical path first, then analysis order (for queues outside the plan)."""
        return -self.priority[label], self._index[label]

    def has_ready(self) -> bool:
        return bool(self._ready)

    def next_sort_key(self) -> tuple[int, int]:
        """``sort_key`` of the target ``pop_ready`` gives next (one must be ready)."""
        priority, index, _label = self._ready[0]
        return priority, index

    def pop_ready(self) -> Label:
        return heapq.heappop(self._ready)[2]

    def blocked(self, label: Label) -> bool:
        """Does ``label`` depend on a failed or skipped target it does not tolerate?"""
        return bool(self.failed_deps(label))

    def failed_deps(self, label: Label) -> list[Label]:
        """Failed or skipped dependencies of ``label`` it does not tolerate."""
        ok = self.tolerant.get(label, frozenset())
        return [dep for dep in self.deps[label] if dep in self.bad and dep not in ok]

    def tolerated_deps(self, label: Label) -> list[Label]:
        """Failed or skipped dependencies that ``label`` runs without."""
        ok = self.tolerant.get(label, frozenset())
        return [dep for dep in self.deps[label] if dep in self.bad and dep in ok]

    def finish(self, label: Label, ok: bool = True) -> None:
        """``label`` is done (``ok=False``: failed or skipped); release its dependents."""
        if not ok:
            self.bad.add(label)
        for parent in self._dependents[label]:
            self._waiting[parent] -= 1
            if self._waiting[parent] == 0:
                self._push(parent)

    def stop(self) -> None:
        """A failure without keep_going: nothing else starts."""
        self.stopped = True
