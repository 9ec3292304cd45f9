"""Shortcuts of an edit build at scale try to give a wrong answer and must not: targets
reused before planning (``Reuse.untouched``), and the tools the ``command`` rule keys,
which the no-op fast path and the incremental path vouch for by stat. Each answer is
compared with a fresh full build."""

import json
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

[mid]
rule = "command"
srcs = [":a"]
outs = ["m.txt"]
cmd = "cat $(SRCS) > $(OUT); echo mid >> $(OUT)"

[top]
rule = "command"
srcs = [":mid", ":b"]
outs = ["top.txt"]
cmd = "cat $(SRCS) > $(OUT)"

[tool]
rule = "command"
outs = ["t.txt"]
cmd = "qbtool > $(OUT)"
"""


def _tool(directory, text):
    directory.mkdir(parents=True, exist_ok=True)
    tool = directory / "qbtool"
    tool.write_text(f"#!/bin/sh\necho {text}\n")
    tool.chmod(0o755)
    return tool


def _settle():
    time.sleep(0.06)  # older than the racy window: the next build may vouch for it


@pytest.fixture
def ws(qbuild_workspace, monkeypatch, tmp_path):
    _tool(tmp_path / "bin", "one")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}")
    qbuild_workspace.write("p/BUILD.toml", BUILD)
    qbuild_workspace.write("p/a.txt", "aaa\n")
    qbuild_workspace.write("p/b.txt", "b\n")
    monkeypatch.chdir(qbuild_workspace.root)
    _settle()
    build("//...")
    _settle()
    build("//...")  # (the first build's folders were too recent to record)
    return qbuild_workspace


def test_untouched_targets_skip_planning_and_agree_with_the_full_path(ws, reused):
    ws.write("p/b.txt", "bb\n")
    _settle()
    reused.clear()
    stdout, stderr = build("//...")
    assert "2 actions run" in stderr  # b and top
    assert sorted(reused) == ["//p:a", "//p:mid", "//p:tool"]
    assert outputs(ws.root, stdout) == full_answer(ws.root)


def test_a_same_size_edit_with_its_mtime_restored_is_seen(ws, reused):
    before = os.stat(ws.path("p/a.txt"))
    ws.write("p/a.txt", "xyz\n")  # same size
    os.utime(ws.path("p/a.txt"), ns=(before.st_atime_ns, before.st_mtime_ns))
    _settle()
    reused.clear()
    stdout, stderr = build("//...")
    assert "//p:a" not in reused and "//p:mid" not in reused
    assert (ws.root / "qbuild-out/p/@top/top.txt").read_text() == "xyz\nmid\nb\n"
    assert outputs(ws.root, stdout) == full_answer(ws.root)


def test_a_dependency_rebuilt_to_other_bytes_rebuilds_its_dependents(ws, reused):
    ws.write("p/a.txt", "a longer line\n")
    _settle()
    reused.clear()
    stdout, stderr = build("//...")
    assert "3 actions run" in stderr  # a, mid, top
    assert sorted(reused) == ["//p:b", "//p:tool"]
    assert (ws.root / "qbuild-out/p/@top/top.txt").read_text() == "a longer line\nmid\nb\n"
    assert outputs(ws.root, stdout) == full_answer(ws.root)


def test_an_untouched_target_s_removed_output_is_placed_again(ws, reused):
    (ws.root / "qbuild-out/p/@mid/m.txt").unlink()
    ws.write("p/b.txt", "b2\n")
    _settle()
    reused.clear()
    stdout, _ = build("//...")
    assert "//p:mid" in reused
    assert (ws.root / "qbuild-out/p/@mid/m.txt").read_text() == "aaa\nmid\n"
    assert outputs(ws.root, stdout) == full_answer(ws.root)


def test_an_untouched_target_s_dropped_cache_entry_runs_it_again(ws, reused):
    from qbuild.store.local import LocalStore

    key = json.loads((ws.root / "qbuild-out/.qbuild/state.json").read_text()
                     )["last_keys"]["//p:mid"]
    store = LocalStore(ws.cache_dir)
    store.drop_action(key)
    store.close()
    ws.write("p/b.txt", "b3\n")
    _settle()
    reused.clear()
    stdout, stderr = build("//...")
    assert "//p:mid" not in reused and "//p:a" in reused
    assert "3 actions run" in stderr  # mid (as the full path would), b, top
    assert outputs(ws.root, stdout) == full_answer(ws.root)


@pytest.mark.parametrize("also_edit", [False, True], ids=["nothing-else", "a-source-too"])
def test_a_tool_replaced_in_place_on_the_same_path_is_seen(ws, tmp_path, reused, also_edit):
    """The no-op fast path and the incremental path skip keying, so they must notice
    what the command rule keys besides PATH: the tool's own bytes."""
    assert (ws.root / "qbuild-out/p/@tool/t.txt").read_text() == "one\n"
    (tmp_path / "bin" / "qbtool").write_text("#!/bin/sh\necho two\n")  # same inode
    if also_edit:
        ws.write("p/b.txt", "b4\n")
    _settle()
    reused.clear()
    stdout, stderr = build("//...")
    assert "nothing changed" not in stderr
    assert "//p:tool" not in reused
    assert (ws.root / "qbuild-out/p/@tool/t.txt").read_text() == "two\n"
    assert outputs(ws.root, stdout) == full_answer(ws.root)


def test_a_tool_added_earlier_on_path_is_seen(ws, tmp_path, monkeypatch):
    """A new tool of that name in a PATH folder searched first (the folder's stat)."""
    first = tmp_path / "first"
    first.mkdir()
    monkeypatch.setenv("PATH", f"{first}:{os.environ['PATH']}")
    build("//...")
    _settle()
    build("//...")
    _tool(first, "shadow")
    _settle()
    _, stderr = build("//...")
    assert "nothing changed" not in stderr
    assert (ws.root / "qbuild-out/p/@tool/t.txt").read_text() == "shadow\n"


def test_an_untouched_target_s_event_record_is_the_event_s_own():
    from qbuild.build.run import cached_record
    from qbuild.events import ActionEvent

    made = ActionEvent("//p:a", "cached", key="k" * 64, origin="local_cache").to_json()
    assert cached_record("//p:a", "k" * 64) == made
    made = ActionEvent("//p:a", "cached", key="k" * 64, origin="remote_cache").to_json()
    assert cached_record("//p:a", "k" * 64, "remote_cache") == made


def test_records_made_field_by_field_have_every_field():
    """Restored action specs, decoded results and keyed action records are filled in
    without their generated __init__: each must hold exactly the class's fields."""
    import dataclasses

    from qbuild.api.actions import ActionSpec
    from qbuild.core.records import ActionResult, OutputEntry
    from qbuild.keys.keyer import _ACTION_DEFAULTS
    from qbuild.shortcuts.analysis_cache import _spec

    spec = ActionSpec("M", "m:f", ("srcs",), ("o",), {"x": 1}, True, {"srcs": ["a"]}, True)
    assert _spec(spec.describe()) == spec
    assert set(_spec(spec.describe()).__dict__) == {f.name for f in dataclasses.fields(spec)}
    result = ActionResult((OutputEntry("a", "d" * 64, 3, True),), ("a",), {"i": 1}, ("w",),
                          providers={"p": {}})
    decoded = ActionResult.from_json(result.to_json())
    assert decoded == result
    assert set(decoded.__dict__) == {f.name for f in dataclasses.fields(result)}
    assert set(decoded.outputs[0].__dict__) == {f.name for f in dataclasses.fields(OutputEntry)}
    from qbuild.core.records import TargetActions

    required = {f.name for f in dataclasses.fields(TargetActions)} - set(_ACTION_DEFAULTS)
    assert required == {"label", "build_file", "rule_ref", "heavy", "attrs", "attr_types",
                        "sources", "deps", "outputs", "key"}  # what keyed() sets itself


def test_a_keyed_action_record_equals_one_made_by_its_init(ws):
    import dataclasses

    from qbuild.build.session import Session
    from qbuild.core.labels import Label
    from qbuild.core.records import TargetActions

    session, _ = Session.open(ws.root)
    try:
        order = session.graph.analyze([Label("p", "a"), Label("p", "mid")])
        results = {}
        for label in order:
            _parts, key, action = session.keyer.keyed(session.graph.targets[label], results)
            assert set(action.__dict__) == {f.name for f in dataclasses.fields(TargetActions)}
            assert TargetActions(**{f.name: getattr(action, f.name)
                             for f in dataclasses.fields(TargetActions)}) == action
            results[label] = session.store.get_action(key)
            assert results[label] is not None  # the same key the build used
    finally:
        session.close()


def test_a_source_edited_after_it_was_vouched_for_is_seen_next_time(ws, monkeypatch):
    """An edit landing after the untouched targets were chosen (during the build) is
    never recorded as seen: the next build keys that target again."""
    from qbuild.shortcuts import incremental as _incremental

    chosen = _incremental.Reuse.untouched

    def edit_then(self, order, targets):
        found = chosen(self, order, targets)
        if any(str(label) == "//p:a" for label in found):
            ws.write("p/a.txt", "edited during the build\n")
        return found

    ws.write("p/b.txt", "b5\n")
    _settle()
    monkeypatch.setattr(_incremental.Reuse, "untouched", edit_then)
    build("//...")
    monkeypatch.setattr(_incremental.Reuse, "untouched", chosen)
    _settle()
    stdout, stderr = build("//...")
    assert "nothing changed" not in stderr
    assert (ws.root / "qbuild-out/p/@a/a.out").read_text() == "edited during the build\n"
    assert outputs(ws.root, stdout) == full_answer(ws.root)


@pytest.mark.parametrize("dist", ["qbuild", "pluggy", "diskcache", "no-such-distribution"])
def test_record_hashes_read_directly_are_importlib_metadata_s(dist, monkeypatch):
    """Code units of installed rules are keyed by their RECORD hashes, read without
    importing importlib.metadata; the table must be exactly what it would give."""
    from qbuild.keys import code as _code

    monkeypatch.setattr(_code, "_records", {})
    direct = _code._record_hashes(dist)
    monkeypatch.setattr(_code, "_records", {})
    monkeypatch.setattr(_code, "_read_record", lambda _name: False)
    assert direct == _code._record_hashes(dist)
