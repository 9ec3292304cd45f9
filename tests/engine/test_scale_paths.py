"""The per-target shortcuts taken for 10,000-target workspaces (issue 10, "Scale and
I/O") never change an answer: memoised key parts, the analysis cache's check of what
JSON holds exactly, and the incremental path after edits far from most targets, a
deleted target and a changed attribute, each compared with a fresh full build."""

import math
import pickle
import time

import pytest
from cli_answers import build, full_answer, outputs

from qbuild.core.records import ActionResult, OutputEntry
from qbuild.keys.parts import _dep_part, dep_part
from qbuild.shortcuts import analysis_cache as _analysis_cache


def test_a_dependency_part_is_computed_once_and_stays_exact():
    result = ActionResult((OutputEntry("a.txt", "d" * 64, 3, True),), ("a.txt",),
                          {"n": 1}, providers={"p.Info": {"x": 1}})
    part = dep_part(result)
    assert dep_part(result) is part  # asked again by every dependent: one computation
    assert part == _dep_part(result)
    copy = pickle.loads(pickle.dumps(result))  # (as sent to a remote worker)
    assert copy == result and dep_part(copy) == part


@pytest.mark.parametrize("value, plain", [
    ({"a": [1, 2.0, "x", None, True, {"b": []}]}, True),
    ({"f": math.nan, "g": -0.0, "h": 10**30}, True),
    ({"a": (1, 2)}, False),  # JSON gives a list back
    ({1: "a"}, False),  # JSON gives the key back as "1"
    ({"a": type("Text", (str,), {})("x")}, False),  # a str subclass comes back a str
    ([{"a": [[[{"b": {1.5}}]]]}], False),
])
def test_the_analysis_cache_keeps_only_what_json_gives_back_exactly(value, plain):
    assert _analysis_cache._plain(value) is plain


def _fan(count):
    blocks = ['[big]\nrule = "command"\nsrcs = ["big.txt"]\nouts = ["n.txt"]\n'
              'cmd = "wc -c < $(SRCS) > $(OUT)"\n',
              '[leaf]\nrule = "command"\nsrcs = ["leaf.txt"]\nouts = ["l.txt"]\n'
              'cmd = "cat $(SRCS) > $(OUT)"\n',
              '[top]\nrule = "command"\nsrcs = [":leaf", ":fan0"]\nouts = ["t.txt"]\n'
              'cmd = "cat $(SRCS) > $(OUT)"\n']
    blocks += [f'[fan{i}]\nrule = "command"\nsrcs = [":big"]\nouts = ["f.txt"]\n'
               f'cmd = "cat $(SRCS) > $(OUT); echo {i} >> $(OUT)"\n' for i in range(count)]
    return "\n".join(blocks)


@pytest.fixture
def fan(qbuild_workspace, monkeypatch):
    qbuild_workspace.write("p/BUILD.toml", _fan(6))
    qbuild_workspace.write("p/big.txt", "big\n")
    qbuild_workspace.write("p/leaf.txt", "leaf\n")
    monkeypatch.chdir(qbuild_workspace.root)
    time.sleep(0.06)  # older than the racy window: the first build is recorded
    build("//...")
    time.sleep(0.06)
    build("//...")  # (the first build's folders were too recent to record)
    return qbuild_workspace


def test_an_edit_far_from_most_targets_rebuilds_exactly_its_path(fan, reused):
    fan.write("p/leaf.txt", "leaf, edited\n")
    time.sleep(0.06)  # older than the racy window: this build may vouch for leaf.txt
    reused.clear()
    stdout, stderr = build("//...")
    assert "2 actions run" in stderr  # leaf and top, nothing else
    assert sorted(reused) == sorted(["//p:big", *(f"//p:fan{i}" for i in range(6))])
    assert (fan.root / "qbuild-out/p/@top/t.txt").read_text() == "leaf, edited\n4\n0\n"
    assert outputs(fan.root, stdout) == full_answer(fan.root)
    reused.clear()
    fan.write("p/big.txt", "bigger\n")  # the other side: every fan rebuilt, leaf reused
    stdout, stderr = build("//...")
    assert "8 actions run" in stderr and sorted(reused) == ["//p:leaf"]
    assert outputs(fan.root, stdout) == full_answer(fan.root)


def test_a_deleted_target_and_a_changed_attribute_agree_with_the_full_path(fan, reused):
    fan.write("p/BUILD.toml", _fan(5))  # fan5 deleted
    stdout, stderr = build("//...")
    assert "0 actions run" in stderr
    assert "fan5" not in stdout
    assert outputs(fan.root, stdout) == full_answer(fan.root)
    time.sleep(0.06)
    build("//...")
    fan.write("p/BUILD.toml", _fan(5).replace("echo 3 >>", "echo three >>"))
    reused.clear()
    stdout, stderr = build("//...")
    assert "1 actions run" in stderr  # fan3 only (top reads fan0)
    assert (fan.root / "qbuild-out/p/@fan3/f.txt").read_text().endswith("three\n")
    assert outputs(fan.root, stdout) == full_answer(fan.root)


def test_a_target_keyed_by_its_one_action_has_that_action_s_own_key(fan):
    """The key is computed before the action record is made (once): it is the key the
    record itself gives, and the one the last build stored its result under."""
    from qbuild.build.session import Session
    from qbuild.keys.action_keys import declared_action_key, declared_action_parts

    session, _ = Session.open(fan.root)
    try:
        graph = session.graph
        results = {}
        for label in graph.analyze(graph.expand(["//..."], None)):
            _parts, key, action = session.keyer.keyed(graph.targets[label], results,
                                                with_parts=False)
            assert action.keyed_by_action and action.key == key
            assert key == declared_action_key(declared_action_parts(action, 0, {}))
            results[label] = session.store.get_action(key)
            assert results[label] is not None, label
    finally:
        session.close()
