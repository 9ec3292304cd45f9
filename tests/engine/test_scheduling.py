"""Scheduling, exactly: the real ``Plan`` and ``Scheduler`` driven over a
``qbuild.testing.FakeExecutor`` (a virtual clock, nothing runs), in the manner of
ninja's build tests. Each test states which actions start when."""

from __future__ import annotations

import pytest

from qbuild.build.plan import Plan
from qbuild.build.scheduler import Scheduler
from qbuild.core.labels import Label
from qbuild.core.records import TargetActions
from qbuild.testing import FakeExecutor


def _label(name: str) -> Label:
    return Label("p", name)


def schedule(graph: dict[str, list[str]], *, jobs: int = 1, cpu: int = 64,
             memory: int = 1 << 20, keep_going: bool = False,
             durations: dict[str, float] | None = None, fail: set[str] = frozenset(),
             threads: dict[str, int] | None = None, mib: dict[str, int] | None = None,
             hits: set[str] = frozenset(), groups: set[str] = frozenset()):
    """Run ``graph`` (name -> dependency names, in dependency order) through the real
    plan and scheduler; returns the fake executor and what the callbacks saw."""
    order = [_label(name) for name in graph]
    plan = Plan(order, {_label(n): [_label(d) for d in deps] for n, deps in graph.items()},
                groups=[label for label in order if label.name in groups])
    fake = FakeExecutor(durations={f"//p:{k}": v for k, v in (durations or {}).items()},
                        fail={f"//p:{name}" for name in fail})
    seen: dict[str, list] = {"hit": [], "ok": [], "failed": [], "skipped": []}

    class Targets:  # the build's side of scheduler.Targets, recording what it saw
        def prepare(self, label: Label) -> TargetActions | bool:
            if label.name in hits:
                seen["hit"].append(label.name)
                return True
            return TargetActions(label=label, build_file="p/BUILD.toml", rule_ref="x:y",
                          heavy=False, attrs={}, attr_types={}, sources={}, deps={},
                          outputs=(), key=label.name,
                          threads=(threads or {}).get(label.name, 1),
                          memory_mib=(mib or {}).get(label.name, 0))

        def queued(self, label: Label) -> None:
            pass

        def finished(self, label: Label, future) -> bool:
            ok = future.exception() is None
            seen["ok" if ok else "failed"].append(label.name)
            return ok

        def skipped(self, label: Label, failed_deps: list[Label]) -> None:
            seen["skipped"].append((label.name, [d.name for d in failed_deps]))

    Scheduler(plan, fake, Targets(), jobs=jobs, cpu=cpu, memory=memory,
              keep_going=keep_going).run()
    return fake, seen


def starts(fake: FakeExecutor) -> list[tuple[float, str]]:
    return [(t, label.removeprefix("//p:")) for t, label in fake.started]


def test_critical_path_first():
    # a -> b -> c is the long chain; x and y are independent leaves, listed first. With
    # one job the chain's head starts first and b (2 to go) before the leaves (1 to go);
    # then c ties with the leaves (1 to go each) and analysis order decides.
    graph = {"x": [], "y": [], "a": [], "b": ["a"], "c": ["b"]}
    fake, _ = schedule(graph, jobs=1)
    assert starts(fake) == [(0, "a"), (1, "b"), (2, "x"), (3, "y"), (4, "c")]


def test_critical_path_keeps_long_chain_busy_with_two_jobs():
    graph = {"x": [], "y": [], "z": [], "a": [], "b": ["a"], "c": ["b"]}
    fake, _ = schedule(graph, jobs=2)
    assert starts(fake) == [(0, "a"), (0, "x"), (1, "b"), (1, "y"), (2, "z"), (2, "c")]
    assert fake.now == 3  # the chain's length: never delayed by the leaves


def test_longer_remaining_chains_start_first():
    # FIFO would start the leaves listed first; the plan starts by chain length.
    graph = {"l1": [], "l2": [], "m1": [], "m2": ["m1"], "h1": [], "h2": ["h1"], "h3": ["h2"]}
    fake, _ = schedule(graph, jobs=1)
    assert [name for _, name in starts(fake)] == ["h1", "m1", "h2", "l1", "l2", "m2", "h3"]


def test_ties_follow_analysis_order():
    fake, _ = schedule({"q": [], "p": [], "r": []}, jobs=1)
    assert [name for _, name in starts(fake)] == ["q", "p", "r"]


def test_jobs_limit_parallelism():
    graph = {name: [] for name in "abcde"}
    fake, _ = schedule(graph, jobs=2)
    assert max(len(fake.running_at(t)) for t, _ in fake.started) == 2
    assert [t for t, _ in fake.started] == [0, 0, 1, 1, 2]


def test_core_budget_limits_what_runs_together():
    # 4 cores: the 3-core action runs alone; the 1-core ones fill around it.
    graph = {"big": [], "s1": [], "s2": [], "s3": []}
    fake, _ = schedule(graph, jobs=4, cpu=4, threads={"big": 3},
                       durations={"big": 2})
    assert starts(fake) == [(0, "big"), (0, "s1"), (1, "s2"), (2, "s3")]


def test_memory_budget_limits_what_runs_together():
    graph = {"m1": [], "m2": [], "m3": []}
    fake, _ = schedule(graph, jobs=3, memory=1000, mib={"m1": 600, "m2": 600, "m3": 300})
    assert starts(fake) == [(0, "m1"), (0, "m3"), (1, "m2")]


def test_an_action_larger_than_the_budget_still_runs_alone():
    fake, _ = schedule({"huge": [], "small": []}, jobs=2, cpu=2, threads={"huge": 2})
    assert starts(fake) == [(0, "huge"), (1, "small")]


def test_stop_at_first_failure_skips_the_rest():
    graph = {"a": [], "b": [], "c": [], "d": ["a"]}
    fake, seen = schedule(graph, jobs=1, fail={"a"})
    assert starts(fake) == [(0, "a")]
    assert seen["failed"] == ["a"]
    assert sorted(seen["skipped"]) == [("b", []), ("c", []), ("d", ["a"])]


def test_stop_lets_running_actions_finish_but_starts_none():
    graph = {"a": [], "b": [], "c": []}
    fake, seen = schedule(graph, jobs=2, fail={"a"}, durations={"b": 3})
    assert starts(fake) == [(0, "a"), (0, "b")]
    assert seen["ok"] == ["b"] and seen["skipped"] == [("c", [])]


def test_keep_going_skips_exactly_the_dependents_of_a_failure():
    graph = {"a": [], "b": ["a"], "c": ["b"], "x": [], "y": ["x"], "z": ["a", "x"]}
    fake, seen = schedule(graph, jobs=1, keep_going=True, fail={"a"})
    assert sorted(name for _, name in starts(fake)) == ["a", "x", "y"]
    assert sorted(seen["skipped"]) == [("b", ["a"]), ("c", ["b"]), ("z", ["a"])]


def test_hits_finish_without_the_executor():
    graph = {"a": [], "b": ["a"], "c": ["b"]}
    fake, seen = schedule(graph, jobs=2, hits={"a", "b"})
    assert seen["hit"] == ["a", "b"] and starts(fake) == [(0, "c")]


def test_groups_pass_through_and_carry_failures():
    graph = {"a": [], "g": ["a"], "after": ["g"]}
    fake, seen = schedule(graph, jobs=1, keep_going=True, fail={"a"}, groups={"g"})
    assert starts(fake) == [(0, "a")]
    assert seen["skipped"] == [("after", ["g"])]


@pytest.mark.parametrize("jobs", [1, 3])
def test_every_action_runs_once_after_its_dependencies(jobs):
    graph = {"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"], "e": [], "f": ["e", "d"]}
    fake, seen = schedule(graph, jobs=jobs, durations={"c": 2.5, "e": 0.5})
    started = {label.removeprefix("//p:"): t for t, label in fake.started}
    ended = {label.removeprefix("//p:"): t for t, label in fake.finished}
    assert sorted(started) == sorted(graph)
    for name, deps in graph.items():
        assert all(ended[d] <= started[name] for d in deps)
