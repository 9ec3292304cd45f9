"""The summary says where each failed target failed, and only what is true of it: "it
ran" for a rule that ran and failed, "it could not start" for one refused or whose
inputs could not be prepared (nothing of it ran, and it is not counted among the actions
run), and "its outputs could not be placed" for one whose result was made or found in
the cache. The counts on the summary line agree with those lines."""

from __future__ import annotations

import os

import diskcache

from qbuild.build.progress import failure_lines, summary_line
from qbuild.core.files import hash_file

RAN = "it ran; a failure is never cached, so the next build runs it again"
NOT_STARTED = ("it could not start: refused, or its inputs could not be prepared; the next "
               "build tries it again")
NOT_PLACED = ("its result was made or found in the cache, but its outputs could not be "
              "placed; the next build places them again")


def test_a_rule_that_ran_and_failed_is_said_to_have_run(ws):
    ws.write("p/BUILD.toml", '[bad]\nrule = "command"\nouts = ["o"]\ncmd = "exit 3"\n')
    out = ws.cli("build", "//p:bad")
    assert out.code == 1, out.stderr
    assert "Build FAILED: 1 targets, 1 actions run (1 failed), 0 cache hits" in out.stderr
    assert f"failed: //p:bad ({RAN}): p/BUILD.toml, target //p:bad" in out.stderr


def test_an_action_whose_input_could_not_be_staged_is_said_not_to_have_started(ws):
    """The cache's stat memo says a.txt holds other bytes than it does: staging the
    input into the sandbox finds out and refuses before the command runs."""
    ws.write("p/a.txt", "a\n")
    ws.write("p/BUILD.toml", '[c]\nrule = "command"\nsrcs = ["a.txt"]\nouts = ["o"]\n'
                             'cmd = "cat $(SRCS) > $(OUT)"\n')
    assert ws.cli("build", "//p:c").code == 0
    ws.cli("clean")  # (also forgets this workspace's own record of digests)
    st = os.stat(ws.path("p/a.txt"))
    memo = diskcache.Cache(str(ws.cache_dir / "memo"))
    memo.set(f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}",
             hash_file(ws.write("elsewhere", "b\n")))
    memo.close()
    out = ws.cli("build", "//p:c")
    assert out.code == 1, out.stderr
    lines = [line.strip() for line in out.stderr.splitlines()]
    (summary,) = [line for line in lines if line.startswith("Build FAILED")]
    assert summary.startswith("Build FAILED: 1 targets, 0 actions run, 0 cache hits, "
                              "1 failed before running, "), summary
    (failed,) = [line for line in lines if line.startswith("failed: ")]
    assert failed.startswith(f"failed: //p:c ({NOT_STARTED}): "), failed
    assert "input p/a.txt does not hold the content its remembered digest says" in failed
    again = ws.cli("build", "//p:c")  # the memo was corrected: it builds
    assert again.code == 0, again.stderr


def _summary(*failures, failed_ran=0, actions_run=0, cache_hits=0):
    return {"ok": False, "targets": len(failures), "actions_run": actions_run,
            "cache_hits": cache_hits, "failed": len(failures), "skipped": 0,
            "seconds": 0.5, "failed_ran": failed_ran, "failures": list(failures)}


def test_each_stage_has_its_own_reason_and_count():
    summary = _summary(
        {"label": "//p:ran", "error": "boom", "ran": True, "stage": "ran"},
        {"label": "//p:refused", "error": "every Dask worker refused the action",
         "ran": False, "stage": "not_started"},
        {"label": "//p:placed", "error": "the outputs of //p:placed could not be placed",
         "ran": False, "stage": "not_placed"},
        failed_ran=1, actions_run=1)
    assert failure_lines(summary) == [
        f"failed: //p:ran ({RAN}): boom",
        f"failed: //p:refused ({NOT_STARTED}): every Dask worker refused the action",
        f"failed: //p:placed ({NOT_PLACED}): the outputs of //p:placed could not be placed"]
    assert summary_line(summary) == ("Build FAILED: 3 targets, 2 actions run (1 failed), "
                                     "0 cache hits, 1 failed before running, 1 built but "
                                     "not placed, 0.50s")


def test_a_summary_without_stages_still_reads_ran_or_not():
    """An event log written before the stage was recorded (``ran`` only)."""
    summary = _summary({"label": "//p:a", "error": "x", "ran": True},
                       {"label": "//p:b", "error": "y", "ran": False}, failed_ran=1)
    assert failure_lines(summary) == [f"failed: //p:a ({RAN}): x",
                                      f"failed: //p:b ({NOT_STARTED}): y"]
