"""Everyday use as a Bazel user expects it (issue 15): manual tags, strict attribute
types, visible matrix variants, conditional attributes, truthful progress, consistent
--quiet/--verbose, grouped warnings, shell-friendly output paths."""

import json
import re
import shlex
import time

import pytest

MANUAL = """
[a]
rule = "command"
outs = ["a.txt"]
cmd = "echo a > $(OUT)"

[slow]
rule = "command"
outs = ["s.txt"]
cmd = "echo s > $(OUT)"
tags = ["manual"]

[uses_slow]
rule = "command"
srcs = [":slow"]
outs = ["u.txt"]
cmd = "cp $(SRCS) $(OUT)"
tags = ["manual", "big"]
"""


# -- 1. tags = ["manual"] ------------------------------------------------------------------
def test_manual_targets_stay_out_of_recursive_patterns_but_build_by_name(ws):
    ws.write("p/BUILD.toml", MANUAL)
    everything = ws.build("//...")
    assert everything.ok, everything.error
    assert everything.ran == ["//p:a"]
    assert ws.build("//p:all").ran == []
    by_name = ws.build("//p:uses_slow")
    assert by_name.ok and sorted(by_name.ran) == ["//p:slow", "//p:uses_slow"]


def test_query_sees_manual_targets_and_filters_by_tags(ws):
    ws.write("p/BUILD.toml", MANUAL)
    out = ws.cli("query", "attr(tags, manual, //...)")
    assert out.code == 0, out.stderr
    assert out.stdout.split() == ["//p:slow", "//p:uses_slow"]
    out = ws.cli("query", "attr(tags, '\\bbig\\b', //...)")
    assert out.stdout.split() == ["//p:uses_slow"]
    out = ws.cli("query", "attr(cmd, 'echo a', //...)")
    assert out.stdout.split() == ["//p:a"]


def test_bad_tags_are_a_config_error(ws):
    ws.write("p/BUILD.toml", '[a]\nrule = "command"\nouts = ["a"]\ncmd = "x"\n'
                             'tags = "manual"\n')
    result = ws.build("//p:a")
    assert result.exit_code == 2
    assert "p/BUILD.toml, target //p:a, attribute 'tags'" in result.error


# -- 2. strict attribute types ---------------------------------------------------------
@pytest.mark.parametrize(("value", "expected"), [
    ('notes = "x"', "attribute 'notes': expected a list of strings, got a string "
                    '(write ["x"])'),
    ('srcs = "a.txt"', "attribute 'srcs': expected a list of files"),
    ('deps = ":b"', "attribute 'deps': expected a list of labels, got a string"),
    ('sep = ["-"]', "attribute 'sep': expected a string, got a list"),
    ('notes = ["x", 3]', "attribute 'notes': item 1: expected a string, got an integer"),
])
def test_shape_errors_are_analysis_errors(ws, value, expected):
    ws.write("p/a.txt", "a")
    ws.write("p/BUILD.toml", f'[a]\nrule = "concat"\n{value}\n[b]\nrule = "concat"\n')
    result = ws.build("//p:a")
    assert result.exit_code == 2, result
    assert "p/BUILD.toml, target //p:a, " + expected in result.error
    assert result.ran == []


def test_out_with_several_outputs_is_an_analysis_error(ws):
    ws.write("p/BUILD.toml", '[a]\nrule = "command"\nouts = ["x", "y"]\n'
                             'cmd = "touch $(OUT)"\n')
    result = ws.build("//p:a")
    assert result.exit_code == 2
    assert "target //p:a, attribute 'cmd': $(OUT) needs exactly one output" in result.error


# -- 3. matrices: visible variants, unknown template keys ---------------------------------
MATRIX = """
[m]
rule = "command"
outs = ["out.txt"]
cmd = "echo {mode} > $(OUT)"
matrix = { mode = ["plain", "fancy"] }

[plain]
rule = "command"
srcs = [":m@mode=plain", "a.txt"]
outs = ["out.txt"]
cmd = "cat $(SRCS) > $(OUT)"
"""


def test_query_lists_matrix_variants_and_prints_build_form(ws):
    ws.write("p/a.txt", "a")
    ws.write("p/BUILD.toml", MATRIX)
    out = ws.cli("query", "//p:all")
    assert out.stdout.split() == ["//p:m", "//p:m@mode=fancy", "//p:m@mode=plain", "//p:plain"]
    out = ws.cli("query", "filter('mode=f', //...)")
    assert out.stdout.split() == ["//p:m@mode=fancy"]
    out = ws.cli("query", "//p:m@mode=fancy", "--output=build")
    assert out.code == 0, out.stderr
    text = out.stdout
    assert "# p/BUILD.toml" in text
    assert '["m@mode=fancy"]\nrule = "command"\n' in text
    assert 'cmd = "echo fancy > $(OUT)"' in text and 'outs = ["out.txt"]' in text
    group = ws.cli("query", "//p:m", "--output=build").stdout  # the group: its variants too
    assert "# //p:m: matrix of 2 variants" in group
    assert '["m@mode=fancy"]' in group and 'cmd = "echo plain > $(OUT)"' in group
    plain = ws.cli("query", "//p:plain", "--output=build").stdout
    assert 'srcs = ["//p:m@mode=plain", "a.txt"]' in plain
    records = json.loads(ws.cli("query", "//p:plain", "--output=json").stdout)
    assert records[0]["attrs"]["srcs"] == ["//p:m@mode=plain", "a.txt"]
    assert records[0]["tags"] == []


def test_unknown_matrix_key_in_a_template_is_named(ws):
    ws.write("p/a.txt", "a")
    ws.write("p/BUILD.toml", MATRIX.replace("echo {mode}", "echo {mdoe}"))
    result = ws.build("//p:m")
    assert result.exit_code == 2
    assert ("p/BUILD.toml, target //p:m, attribute 'cmd': '{mdoe}' names no matrix key "
            "(matrix keys: mode); did you mean {mode}?") in result.error
    ws.write("p/BUILD.toml", MATRIX.replace('":m@mode=plain"', '":m@mode={mode}"'))
    result = ws.build("//p:plain")
    assert ("target //p:plain, attribute 'srcs': '{mode}' is a matrix template, but this "
            "target has no matrix") in result.error
    ws.write("p/BUILD.toml", MATRIX.replace("[plain]", "[plain]\nmatrix = { k = [1] }")
             .replace('":m@mode=plain"', '":m@mode={kk}"'))
    result = ws.build("//p:plain")
    assert "attribute 'srcs': '{kk}' names no matrix key (matrix keys: k)" in result.error
    ws.write("p/BUILD.toml", MATRIX.replace("echo {mode}", "awk '{print}' /dev/null; echo"))
    assert ws.build("//p:m").ok  # braces that are not templates are left alone


def test_rules_command_says_when_an_attribute_applies(ws):
    out = ws.cli("rules", "calibrate")
    assert out.code == 0, out.stderr
    assert "percentile: number (default: 99.999; only when method is 'percentile')" in out.stdout


# -- 6. progress: running vs queued, failures explained -----------------------------------
def test_event_log_separates_queued_from_running(ws, tmp_path):
    ws.write("p/BUILD.toml", "".join(
        f'[s{i}]\nrule = "command"\nouts = ["o"]\ncmd = "sleep 0.3; echo {i} > $(OUT)"\n'
        for i in range(3)))
    log = tmp_path / "events.jsonl"
    out = ws.cli("build", "//p:all", "-j", "1", "--event_log", str(log))
    assert out.code == 0, out.stderr
    events = [json.loads(line) for line in log.read_text().splitlines()]
    kinds = [e["event"] for e in events]
    assert kinds.count("action_queued") == 3 and kinds.count("action_started") == 3
    # with one job, an action starts only after the one before it finished
    running = 0
    for event in events:
        if event["event"] == "action_started":
            running += 1
            assert running == event["running"] == 1, events
        elif event["event"] == "action_finished":
            running -= 1
    starts = [e for e in events if e["event"] == "action_started"]
    assert [e["queued"] for e in starts[1:]] == [1, 0]


def test_live_line_counts_running_and_queued_separately():
    import io

    from qbuild.build.progress import ConsoleReporter

    stream = io.StringIO()
    reporter = ConsoleReporter(stream, tty=True)
    reporter.build_started(4)
    for label in ("//p:a", "//p:b", "//p:c"):
        reporter.action_queued(label)
    reporter.action_started("//p:a")
    time.sleep(0.05)
    reporter.action_started("//p:b")
    line = stream.getvalue().rsplit("\r\x1b[2K", 1)[-1]
    assert line.startswith("[0/4] 2 running, 1 queued; slowest: //p:a ")
    reporter.build_finished({"ok": True, "targets": 1, "actions_run": 0, "cache_hits": 0,
                             "failed": 0, "skipped": 0, "seconds": 0.1})


def test_lines_off_a_terminal_are_written_in_batches_in_order_and_soon():
    """Off a terminal, "built" lines are held back briefly and written many at a time
    (one system call per action was measurable at 10,000 actions), never after a later
    line, and never longer than a moment even while a long action runs."""
    import io

    from qbuild.build.progress import _HOLD, ConsoleReporter

    stream = io.StringIO()
    reporter = ConsoleReporter(stream, tty=False)
    reporter.build_started(3)
    for label in ("//p:a", "//p:b"):
        reporter.action_started(label)
        reporter.action_finished({"label": label, "status": "ran", "seconds": 0.01})
    reporter.action_started("//p:c")  # a long action: nothing else happens meanwhile
    deadline = time.monotonic() + 10 * _HOLD + 5
    while "built //p:b" not in stream.getvalue():
        assert time.monotonic() < deadline, "held lines were never written"
        time.sleep(0.02)
    reporter.action_finished({"label": "//p:c", "status": "failed", "error": "boom"})
    reporter.message("a message")
    reporter.build_finished({"ok": False, "targets": 3, "actions_run": 2, "cache_hits": 0,
                             "failed": 1, "skipped": 0, "seconds": 0.1})
    lines = stream.getvalue().splitlines()
    assert lines[:4] == ["[1/3] built //p:a (0.01s)", "[2/3] built //p:b (0.01s)",
                         "FAILED: //p:c (why: in the summary)", "a message"]
    assert lines[4].startswith("Build FAILED")


def test_a_failed_rerun_says_what_failed_and_that_it_ran_again(ws):
    ws.write("p/BUILD.toml", '[ok]\nrule = "command"\nouts = ["o"]\ncmd = "echo > $(OUT)"\n'
                             '[bad]\nrule = "command"\nsrcs = [":ok"]\nouts = ["o"]\n'
                             'cmd = "exit 3"\n'
                             '[after]\nrule = "command"\nsrcs = [":bad"]\nouts = ["o"]\n'
                             'cmd = "cp $(SRCS) $(OUT)"\n')
    first = ws.cli("build", "//p:after")
    assert first.code == 1
    again = ws.cli("build", "//p:after")
    assert again.code == 1
    err = again.stderr
    assert "Build FAILED: 1 targets, 1 actions run (1 failed), 1 cache hits, 1 skipped" in err
    assert ("failed: //p:bad (it ran; a failure is never cached, so the next build runs it "
            "again): p/BUILD.toml, target //p:bad, attribute 'cmd': command exited with "
            "status 3") in err
    assert "skipped: //p:after (depends on failed //p:bad)" in err


# -- 7. --quiet / --verbose, grouped warnings -------------------------------------------
WARN = """
[w]
rule = "warn"
matrix = { n = ["1", "2", "3"] }
"""


@pytest.mark.parametrize("where", ["before", "after"])
def test_quiet_silences_progress_and_summary_on_every_command(ws, where):
    ws.write("p/BUILD.toml", MANUAL)

    def run(*args):
        flags = ("--quiet",)
        return ws.cli(*flags, *args) if where == "before" else ws.cli(*args, *flags)

    built = run("build", "//p:a")
    assert built.code == 0 and built.stderr == ""
    assert built.stdout.strip() == "qbuild-out/p/@a/a.txt"
    assert run("build", "//p:a").stderr == ""  # the no-op fast path too
    assert run("clean").stderr == "" and run("clean").stdout == ""
    failing = ws.cli("build", "//p:nothere", "--quiet")
    assert failing.code == 2 and failing.stderr.startswith("ERROR: ")
    assert ws.cli("--quiet", "--verbose", "build", "//p:a").code == 2


def test_verbose_gives_tracebacks_wherever_it_is_written(ws):
    ws.write("p/BUILD.toml", MANUAL)
    for args in (("--verbose", "query", "deps("), ("query", "deps(", "--verbose")):
        out = ws.cli(*args)
        assert out.code == 2 and "Traceback" in out.stderr, args
    assert "Traceback" not in ws.cli("query", "deps(").stderr


def test_warnings_are_grouped_per_rule_with_counts(ws):
    ws.write("p/BUILD.toml", WARN)
    result = ws.build("//p:w")
    assert result.ok, result.error
    assert result.log.count("WARNING") == 1, result.log
    assert ("WARNING: warn (3 targets: //p:w@n=1, //p:w@n=2, //p:w@n=3): this toy always "
            "warns") in result.log


# -- 8. shell-friendly output paths ---------------------------------------------------
def test_build_quotes_paths_and_outputs_prints_them_one_per_line(ws):
    ws.write("p/a.txt", "a")
    ws.write("p/BUILD.toml", MATRIX.replace('outs = ["out.txt"]\ncmd = "echo {mode}',
                                            'outs = ["my out.txt"]\ncmd = "echo {mode}'))
    built = ws.cli("build", "//p:m", "//p:plain")
    assert built.code == 0, built.stderr
    lines = built.stdout.splitlines()
    # '@', '=' and ',' need no quoting in a POSIX shell; the space does
    assert lines == ["'qbuild-out/p/@m@mode=plain/my out.txt'",
                     "'qbuild-out/p/@m@mode=fancy/my out.txt'", "qbuild-out/p/@plain/out.txt"]
    assert [shlex.split(line)[0] for line in lines][:2] == [
        "qbuild-out/p/@m@mode=plain/my out.txt", "qbuild-out/p/@m@mode=fancy/my out.txt"]
    assert ws.cli("build", "//p:m", "//p:plain").stdout == built.stdout  # no-op fast path
    out = ws.cli("outputs", "//p:m", "//p:plain")
    assert out.code == 0, out.stderr
    assert out.stdout.splitlines() == ["qbuild-out/p/@m@mode=plain/my out.txt",
                                       "qbuild-out/p/@m@mode=fancy/my out.txt",
                                       "qbuild-out/p/@plain/out.txt"]
    sub = ws.cli("outputs", ":plain", cwd="p")
    assert sub.stdout.splitlines() == ["../qbuild-out/p/@plain/out.txt"]
    assert ws.cli("outputs", "//p:zz").code == 2


# -- 5. where things are ------------------------------------------------------------------
def test_summary_names_the_cache_and_its_size(ws):
    ws.write("p/BUILD.toml", MANUAL)
    built = ws.cli("build", "//p:a")
    assert built.code == 0, built.stderr
    summary = built.stderr.strip().splitlines()[-1]
    assert summary.startswith("Build OK: 1 targets, 1 actions run, 0 cache hits")
    assert f"; cache {ws.cache_dir} (" in summary and summary.endswith(" KB)")
    again = ws.cli("build", "//p:a")  # the no-op fast path says it too
    assert f"; cache {ws.cache_dir} (" in again.stderr
    home = ws.cli("build", "//p:a", "//p:slow", env={"HOME": str(ws.cache_dir.parent)})
    assert "; cache ~/cache (" in home.stderr


def test_cache_stats_in_human_sizes_and_never_recreates_an_expunged_cache(ws):
    ws.write("p/BUILD.toml", MANUAL)
    assert ws.cli("build", "//p:a").code == 0
    stats = ws.cli("cache", "stats")
    assert stats.code == 0, stats.stderr
    lines = dict(line.split(": ", 1) for line in stats.stdout.splitlines())
    assert lines["directory"] == str(ws.cache_dir)
    for key in ("blob_bytes", "action_cache_bytes"):
        assert re.fullmatch(r"\d+ B|\d+\.\d (KB|MB)", lines[key]), lines
    assert ws.cli("clean", "--expunge").code == 0
    assert not ws.cache_dir.exists()
    for args in (("cache", "stats"), ("cache", "gc", "--max-size", "1G")):
        out = ws.cli(*args)
        assert out.code == 0 and "no cache there" in out.stdout, out
        assert not ws.cache_dir.exists(), args


def test_verbose_build_shows_every_action_and_each_warning(ws):
    ws.write("p/BUILD.toml", MANUAL)
    assert ws.cli("build", "//p:a").code == 0
    out = ws.cli("build", "//p:a", "//p:slow", "--verbose")
    assert "[1/2] cached //p:a" in out.stderr or "[2/2] cached //p:a" in out.stderr, out.stderr
    plain = ws.cli("build", "//p:a", "//p:slow", "//p:uses_slow")
    assert "cached //p:a" not in plain.stderr
