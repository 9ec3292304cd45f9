"""``qbuild.forward_files`` (``filegroup``'s action): over source files the engine
stores each source without a sandbox or a call. These tests try to break that shortcut:
outputs stay private copies with the source's mode, a source edited after it was keyed
is never stored under the old key, identical contents share one blob without leaving
files behind, and where the shortcut does not apply the function itself gives the same
result in a sandbox."""

import os
import stat
import threading
import time

import toy_rules_v2

import qbuild
from qbuild.api.actions import FORWARD_FILES, function_ref


def test_the_engine_knows_forward_files_by_its_reference():
    assert function_ref(qbuild.forward_files) == FORWARD_FILES


def test_outputs_are_private_read_only_copies_with_the_source_mode(ws):
    ws.write("p/a.txt", "alpha\n")
    script = ws.write("p/run.sh", "#!/bin/sh\necho hi\n")
    os.chmod(script, 0o755)
    ws.write("p/BUILD.toml", '[g]\nrule = "filegroup"\nsrcs = ["a.txt", "run.sh"]\n')
    result = ws.build("//p:g")
    assert result.ok and result.ran == ["//p:g"], result.error
    text, run = result.outputs("//p:g")
    assert text.read_text() == "alpha\n" and run.read_text() == "#!/bin/sh\necho hi\n"
    assert stat.S_IMODE(text.stat().st_mode) == 0o444
    assert stat.S_IMODE(run.stat().st_mode) == 0o555
    for out, source in ((text, ws.path("p/a.txt")), (run, script)):
        assert out.stat().st_ino != source.stat().st_ino
        assert out.stat().st_nlink == 1  # not the blob's inode either
    assert list((ws.cache_dir / "tmp").iterdir()) == []  # nothing left behind
    os.chmod(text, 0o644)  # a user editing the output reaches neither source nor cache
    text.write_text("edited")
    assert ws.path("p/a.txt").read_text() == "alpha\n"
    again = ws.build("//p:g")
    assert again.ran == [] and again.outputs("//p:g")[0].read_text() == "alpha\n"


def test_identical_sources_share_one_blob_and_leave_nothing(ws):
    for name in ("a", "b", "c"):
        ws.write(f"p/{name}.txt", "same bytes\n")
    ws.write("p/BUILD.toml", "\n".join(
        f'[{name}]\nrule = "filegroup"\nsrcs = ["{name}.txt"]\n' for name in "abc"))
    result = ws.build("//p:a", "//p:b", "//p:c")
    assert result.ok and sorted(result.ran) == ["//p:a", "//p:b", "//p:c"], result.error
    for name in "abc":
        assert result.output(f"//p:{name}").read_text() == "same bytes\n"
    assert list((ws.cache_dir / "tmp").iterdir()) == []


def test_a_source_edited_after_it_was_keyed_is_never_stored_under_the_old_key(
        ws, tmp_path, monkeypatch):
    ws.write("p/a.txt", "before")
    ws.write("p/b.txt", "one")
    # -j 1: the slow target runs first (analysis order), the filegroup after it.
    ws.write("p/BUILD.toml", '[s]\nrule = "slow"\nsrcs = ["a.txt"]\nseconds = 0.0\n\n'
                             '[g]\nrule = "filegroup"\nsrcs = ["b.txt"]\n')
    started, edited = tmp_path / "started", tmp_path / "edited"
    monkeypatch.setenv("TOY_STARTED", str(started))
    monkeypatch.setenv("TOY_WAIT_FOR", str(edited))  # the slow action ends after the edit

    def edit():
        deadline = time.monotonic() + 60
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        ws.write("p/b.txt", "two, longer")
        edited.touch()

    thread = threading.Thread(target=edit)
    thread.start()
    result = ws.build("//p:s", "//p:g", jobs=1)
    thread.join()
    if "//p:g" in result.failed:
        assert "changed while the build ran" in result.failed["//p:g"]
    else:  # keyed after the edit: then it holds the edited bytes
        assert result.output("//p:g").read_text() == "two, longer"
    again = ws.build("//p:g")
    assert again.ok and again.output("//p:g").read_text() == "two, longer"
    assert list((ws.cache_dir / "tmp").iterdir()) == []


def test_where_the_shortcut_does_not_apply_the_function_runs_in_a_sandbox(ws):
    """forward_files over another target's outputs (not sources): the function's own
    body, in a sandbox, gives what the shortcut gives for sources."""
    ws.register(toy_rules_v2)
    ws.write("p/a.txt", "alpha\n")
    ws.write("p/BUILD.toml", '[g]\nrule = "filegroup"\nsrcs = ["a.txt"]\n\n'
                             '[f]\nrule = "forward_deps"\nsrcs = [":g"]\nouts = ["b.txt"]\n')
    result = ws.build("//p:f", "//p:g")
    assert result.ok, result.error
    assert result.output("//p:f").read_text() == result.output("//p:g").read_text()
    assert stat.S_IMODE(result.output("//p:f").stat().st_mode) == 0o444
