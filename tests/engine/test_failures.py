"""Failing, corrupted, killed and concurrent builds never serve a wrong artifact."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

GOOD_AND_BAD = """
[good]
rule = "concat"
srcs = ["a.txt"]

[bad]
rule = "fail"
message = "the model is not ONNX"

[after_bad]
rule = "concat"
deps = [":bad"]

[after_good]
rule = "concat"
deps = [":good"]
"""


def test_failing_action_reports_error_and_log_tail_and_stores_nothing(ws):
    ws.write("p/a.txt", "a")
    ws.write("p/BUILD.toml", GOOD_AND_BAD)
    result = ws.build("//p:bad")
    assert not result.ok and result.exit_code == 1
    assert "the model is not ONNX" in result.failed["//p:bad"]
    assert "attribute 'message'" in result.failed["//p:bad"]
    assert "step 2 about to fail" in result.log
    assert not ws.path("qbuild-out/p/@bad").exists()
    again = ws.build("//p:bad")
    assert again.failed  # reran (nothing cached), failed again


def test_unexpected_exception_in_a_rule_is_a_clean_failure(ws):
    ws.write("p/BUILD.toml", '[c]\nrule = "fail"\ncrash = true\n')
    result = ws.build("//p:c")
    assert result.exit_code == 1
    assert "ZeroDivisionError: division by zero in the rule" in result.failed["//p:c"]
    assert "Traceback" in result.log  # the traceback is in the action log tail


def test_keep_going_builds_what_does_not_depend_on_the_failure(ws):
    ws.write("p/a.txt", "a")
    ws.write("p/BUILD.toml", GOOD_AND_BAD)
    result = ws.build("//p:after_bad", "//p:after_good", keep_going=True, jobs=1)
    assert "//p:after_good" in result.ran
    assert result.skipped == ["//p:after_bad"]
    # the next build reruns only what failed
    fixed_rule = 'rule = "concat"\nsrcs = ["a.txt"]\nrepeat = 2'
    ws.write("p/BUILD.toml", GOOD_AND_BAD.replace(
        'rule = "fail"\nmessage = "the model is not ONNX"', fixed_rule))
    fixed = ws.build("//p:after_bad", "//p:after_good")
    assert sorted(fixed.ran) == ["//p:after_bad", "//p:bad"]


def test_undeclared_missing_output_fails(ws):
    ws.write("p/BUILD.toml", '[f]\nrule = "forgetful"\n')
    result = ws.build("//p:f")
    assert "did not write declared output 'b.txt'" in result.failed["//p:f"]


def _blob_holding(cache_dir, text):
    for path in (cache_dir / "cas").rglob("*.val"):
        if path.read_bytes() == text.encode():
            return path
    raise AssertionError(f"no blob holds {text!r}")


def test_corrupt_blob_is_discarded_and_rebuilt(ws):
    ws.write("p/a.txt", "alpha")
    ws.write("p/BUILD.toml", '[a]\nrule = "concat"\nsrcs = ["a.txt"]\nrepeat = 3\n')
    first = ws.build("//p:a")
    assert first.ok, first.error
    blob = _blob_holding(ws.cache_dir, "alphaalphaalpha")
    os.chmod(blob, 0o644)
    blob.write_text("garbage!garbage")
    os.utime(blob, ns=(0, 0))
    first.output("//p:a").unlink()
    result = ws.build("//p:a")
    assert result.ok, result.error
    assert result.output("//p:a").read_text() == "alphaalphaalpha"
    assert "restored //p:a by running it again" in result.log


def test_editing_an_output_in_qbuild_out_never_reaches_the_cache(ws, tmp_path):
    """qbuild-out holds private copies: an owner who chmods and edits one (or root, whom
    modes do not stop) changes neither the blob nor another workspace's copy."""
    ws.write("p/a.txt", "alpha")
    ws.write("p/BUILD.toml", '[a]\nrule = "concat"\nsrcs = ["a.txt"]\nrepeat = 3\n')
    out = ws.build("//p:a").output("//p:a")
    assert not os.stat(out).st_mode & 0o222
    os.chmod(out, 0o644)
    out.write_text("garbage!garbage")
    assert _blob_holding(ws.cache_dir, "alphaalphaalpha")
    other = type(ws)(tmp_path / "other", ws.cache_dir)
    other.plugins = list(ws.plugins)
    other.write("p/a.txt", "alpha")
    other.write("p/BUILD.toml", '[a]\nrule = "concat"\nsrcs = ["a.txt"]\nrepeat = 3\n')
    theirs = other.build("//p:a")
    assert theirs.ran == []
    assert theirs.output("//p:a").read_text() == "alphaalphaalpha"
    again = ws.build("//p:a")  # our edited copy is replaced from the intact cache
    assert again.ran == [] and "restored" not in again.log
    assert again.output("//p:a").read_text() == "alphaalphaalpha"


def test_file_edited_during_an_action_is_not_cached(ws, tmp_path, monkeypatch):
    ws.write("p/a.txt", "before")
    ws.write("p/BUILD.toml", '[s]\nrule = "slow"\nsrcs = ["a.txt"]\nseconds = 0.0\n')
    import threading

    started, edited = tmp_path / "started", tmp_path / "edited"
    monkeypatch.setenv("TOY_STARTED", str(started))
    monkeypatch.setenv("TOY_WAIT_FOR", str(edited))  # the action ends after the edit

    def edit():  # once the action runs (not after a guess at how long analysis takes)
        deadline = time.monotonic() + 60
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        ws.write("p/a.txt", "after!")
        edited.touch()

    thread = threading.Thread(target=edit)
    thread.start()
    result = ws.build("//p:s")
    thread.join()
    assert "changed while the action ran" in result.failed["//p:s"]
    rebuilt = ws.build("//p:s")
    assert rebuilt.ran == ["//p:s"]
    assert "after!" in rebuilt.output("//p:s").read_text()


def _cli_env(ws, extra=None):
    env = dict(os.environ)
    tests_dir = str(Path(__file__).parent)
    env["PYTHONPATH"] = tests_dir + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra or {})
    return env


RUNNER = """
import sys, toy_rules
from qbuild.testing import Workspace
from pathlib import Path
ws = Workspace.existing(Path(sys.argv[1]), plugins=[toy_rules])
result = ws.build(*sys.argv[2:])
print("RAN", " ".join(result.ran))
print("OK" if result.ok else "FAILED " + result.error)
"""


def _spawn(ws, *patterns, extra_env=None):
    return subprocess.Popen([sys.executable, "-c", RUNNER, str(ws.root),
                             *patterns], env=_cli_env(ws, extra_env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_kill_9_during_an_action_leaves_a_usable_cache(ws, tmp_path):
    ws.write("p/a.txt", "alpha")
    ws.write("p/BUILD.toml", """
        [a]
        rule = "concat"
        srcs = ["a.txt"]

        [s]
        rule = "slow"
        srcs = ["a.txt"]
        seconds = 30.0

        [top]
        rule = "concat"
        deps = [":a", ":s"]
    """)
    marker = tmp_path / "started"
    proc = _spawn(ws, "//p:top", extra_env={"TOY_STARTED": str(marker)})
    deadline = time.time() + 60
    while not marker.exists() and time.time() < deadline:
        time.sleep(0.05)
    assert marker.exists(), proc.communicate()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    ws.write("p/BUILD.toml", ws.path("p/BUILD.toml").read_text().replace("30.0", "0.1"))
    result = ws.build("//p:top")
    assert result.ok, result.error
    assert result.output("//p:top").read_text() == "alphaslept 0.1\nalpha"


def test_two_concurrent_builds_of_overlapping_targets_both_succeed(ws):
    ws.write("p/a.txt", "alpha")
    ws.write("p/BUILD.toml", """
        [s1]
        rule = "slow"
        srcs = ["a.txt"]
        seconds = 0.5

        [s2]
        rule = "slow"
        srcs = ["a.txt"]
        seconds = 0.6

        [x]
        rule = "concat"
        deps = [":s1", ":s2"]

        [y]
        rule = "concat"
        deps = [":s2", ":s1"]
        sep = "|"
    """)
    first = _spawn(ws, "//p:x", "//p:y")
    second = _spawn(ws, "//p:y", "//p:x")
    out1, err1 = first.communicate(timeout=120)
    out2, err2 = second.communicate(timeout=120)
    assert "OK" in out1, out1 + err1
    assert "OK" in out2, out2 + err2
    expected_x = "slept 0.5\nalphaslept 0.6\nalpha"
    assert ws.path("qbuild-out/p/@x/out.txt").read_text() == expected_x
    assert ws.path("qbuild-out/p/@y/out.txt").read_text() == "slept 0.6\nalpha|slept 0.5\nalpha"
    assert ws.build("//p:x", "//p:y").ran == []
