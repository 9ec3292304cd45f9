"""The incremental path: after a source edit only the targets downstream of it are
keyed; everything it reuses is exactly what the full path would compute, and any doubt
(a dropped cache entry, edited rule code, another environment) keys the target again."""

import os
import time

import pytest
from cli_answers import build, full_answer, outputs

BUILD = """
[a]
rule = "command"
srcs = ["a.txt"]
outs = ["a.out"]
cmd = "cat $(SRCS) > $(OUT)"

[b]
rule = "command"
srcs = ["b.txt"]
outs = ["b.out"]
cmd = "cat $(SRCS) > $(OUT)"

[size]
rule = "command"
srcs = [":a"]
outs = ["n.txt"]
cmd = "wc -c < $(SRCS) > $(OUT)"

[top]
rule = "command"
srcs = [":size", ":b"]
outs = ["top.txt"]
cmd = "cat $(SRCS) > $(OUT)"
"""


@pytest.fixture
def ws(qbuild_workspace, monkeypatch):
    qbuild_workspace.write("p/BUILD.toml", BUILD)
    qbuild_workspace.write("p/a.txt", "aaa\n")
    qbuild_workspace.write("p/b.txt", "b\n")
    monkeypatch.chdir(qbuild_workspace.root)
    time.sleep(0.06)  # older than the racy window: the first build is recorded
    build("//...")
    return qbuild_workspace


def test_an_edit_keys_only_what_is_downstream(ws, reused):
    ws.write("p/b.txt", "bb\n")
    reused.clear()
    stdout, stderr = build("//...")
    assert "2 actions run" in stderr  # b and top
    assert sorted(reused) == ["//p:a", "//p:size"]
    assert outputs(ws.root, stdout) == full_answer(ws.root)


def test_a_dependency_rebuilt_to_the_same_bytes_stops_the_rebuild(ws, reused):
    time.sleep(0.06)
    ws.write("p/a.txt", "xyz\n")  # same size: :size gives the same bytes
    reused.clear()
    stdout, stderr = build("//...")
    assert "2 actions run" in stderr  # a and size; top is a cache hit
    assert "//p:b" in reused
    assert outputs(ws.root, stdout) == full_answer(ws.root)
    time.sleep(0.06)
    build("//...")  # records the analysis and keys (the edit is old enough now)
    os.utime(ws.path("p/a.txt"))  # touched: a keyed again, same key and result
    reused.clear()
    stdout, stderr = build("--event_log", str(ws.root.parent / "events.jsonl"), "//...")
    assert "0 actions run" in stderr
    assert sorted(reused) == ["//p:b", "//p:size", "//p:top"]


def test_a_dropped_cache_entry_is_not_reused(ws, reused):
    from qbuild.store.local import LocalStore

    state = ws.root / "qbuild-out/.qbuild/state.json"
    import json

    key = json.loads(state.read_text())["last_keys"]["//p:size"]
    store = LocalStore(ws.cache_dir)
    store.drop_action(key)
    store.close()
    ws.write("p/b.txt", "bbb\n")
    reused.clear()
    stdout, stderr = build("//...")
    assert "//p:size" not in reused and "//p:a" in reused
    assert "3 actions run" in stderr  # size ran again (as the full path would), b, top
    assert outputs(ws.root, stdout) == full_answer(ws.root)


def test_other_settings_take_the_full_path(ws, reused, monkeypatch):
    ws.write("p/b.txt", "b2\n")
    monkeypatch.setenv("LANG", "C.qbuild-test")  # keyed by the command rule
    reused.clear()
    build("//...")
    assert reused == []
    ws.write("p/b.txt", "b3\n")
    reused.clear()
    build("--explain", "//...")  # --explain is the full path
    assert reused == []


def test_a_recent_edit_is_never_recorded_as_reusable(ws, reused):
    ws.write("p/b.txt", "new\n")
    future = time.time_ns() + 30 * 10**9  # (however slow this machine is today)
    os.utime(ws.path("p/b.txt"), ns=(future, future))
    build("//...")  # b.txt is too recent to vouch for: not recorded as reusable
    record = next((ws.root / "qbuild-out/.qbuild/incremental").iterdir())
    import json

    targets = json.loads(record.read_text())["targets"]
    assert targets["//p:b"][2] is None and targets["//p:a"][2] is not None
    reused.clear()
    stdout, _ = build("--event_log", str(ws.root.parent / "events.jsonl"), "//...")
    assert "//p:b" not in reused
    assert outputs(ws.root, stdout) == full_answer(ws.root)


def test_a_build_that_keyed_nothing_still_vouches_for_the_rule_code(ws, reused):
    """The next fast path checks the rule code the reused keys rest on."""
    import json

    snapshot = next((ws.root / "qbuild-out/.qbuild/noop").iterdir())
    before = set(json.loads(snapshot.read_text())["files"])
    reused.clear()
    build("--event_log", str(ws.root.parent / "events.jsonl"), "//...")
    assert len(reused) == 4
    build("//...")  # the snapshot of that build (nothing keyed) answers
    after = set(json.loads(snapshot.read_text())["files"])
    assert before <= after, before - after
