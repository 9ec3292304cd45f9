"""The command line: query, graph, explain, clean, cache, rules, version, progress."""

import json

PIPELINE = """
[src]
rule = "filegroup"
srcs = ["*.txt"]

[upper]
rule = "command"
srcs = [":src"]
outs = ["up.txt"]
cmd = "cat $(SRCS) | tr a-z A-Z > $(OUT)"

[count]
rule = "command"
srcs = [":upper"]
outs = ["n.txt"]
cmd = "wc -c < $(location :upper) | tr -d ' ' > $(OUT)"

[other]
rule = "command"
outs = ["o.txt"]
cmd = "echo other > $(OUT)"
"""


def _setup(ws):
    ws.write("p/a.txt", "abc\n")
    ws.write("p/BUILD.toml", PIPELINE)
    ws.write("q/sub/BUILD.toml", """
        [uses]
        rule = "command"
        srcs = ["//p:count"]
        outs = ["u.txt"]
        cmd = "cp $(SRCS) $(OUT)"
    """)


def test_build_prints_output_paths_and_summary_from_a_subdirectory(ws):
    _setup(ws)
    result = ws.cli("build", ":count", cwd="p")
    assert result.code == 0, result.stderr
    assert result.stdout.strip() == "../qbuild-out/p/@count/n.txt"
    assert ws.path("qbuild-out/p/@count/n.txt").read_text() == "4\n"
    assert "Build OK: 1 targets, 3 actions run, 0 cache hits" in result.stderr
    assert "[3/3] built //p:count" in result.stderr
    assert not ws.path("qbuild-out/p/@upper").exists()  # intermediates are not copied out


def test_event_log_is_json_lines(ws, tmp_path):
    _setup(ws)
    log = tmp_path / "events.jsonl"
    assert ws.cli("build", "//p:count", "--event_log", str(log)).code == 0
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert events[0]["event"] == "build_started" and events[0]["total"] == 3
    finished = [e for e in events if e["event"] == "action_finished"]
    assert [e["label"] for e in finished] == ["//p:src", "//p:upper", "//p:count"]
    assert events[-1]["event"] == "build_finished" and events[-1]["actions_run"] == 3


def test_patterns(ws):
    _setup(ws)
    assert ws.cli("query", "//...").stdout.split() == [
        "//p:count", "//p:other", "//p:src", "//p:upper", "//q/sub:uses"]
    assert ws.cli("query", "//p:all").stdout.split() == [
        "//p:count", "//p:other", "//p:src", "//p:upper"]
    assert ws.cli("query", "//q/...").stdout.split() == ["//q/sub:uses"]


def _in_process(ws, monkeypatch, *args):
    """The real command line, called in this process (a query is answered in a few
    milliseconds; a subprocess would spend most of a second starting Python)."""
    import contextlib
    import io

    from qbuild import cli

    monkeypatch.chdir(ws.root)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(args))
    return code, out.getvalue(), err.getvalue()


def test_query_functions_and_set_operations(ws, monkeypatch):
    _setup(ws)

    def q(expr):
        code, stdout, stderr = _in_process(ws, monkeypatch, "query", expr)
        assert code == 0, stderr
        return stdout.split()

    assert q("deps(//q/sub:uses)") == ["//p:count", "//p:src", "//p:upper", "//q/sub:uses"]
    assert q("deps(//q/sub:uses, 1)") == ["//p:count", "//q/sub:uses"]
    assert q("rdeps(//..., //p:upper)") == ["//p:count", "//p:upper", "//q/sub:uses"]
    assert q("kind('filegroup', deps(//q/sub:uses))") == ["//p:src"]
    assert q("allpaths(//q/sub:uses, //p:src)") == [
        "//p:count", "//p:src", "//p:upper", "//q/sub:uses"]
    assert q("//p:all - deps(//p:count)") == ["//p:other"]
    assert q("//p:other + //p:src") == ["//p:other", "//p:src"]
    assert q("deps(//p:count) ^ rdeps(//..., //p:upper)") == ["//p:count", "//p:upper"]
    records = json.loads(_in_process(ws, monkeypatch, "query", "//p:count", "--output",
                                     "json")[1])
    assert [{k: r[k] for k in ("label", "kind", "deps", "build_file")} for r in records] == [
        {"label": "//p:count", "kind": "command", "deps": ["//p:upper"],
         "build_file": "p/BUILD.toml"}]
    assert records[0]["attrs"]["outs"] == ["n.txt"]
    assert _in_process(ws, monkeypatch, "query", "deps(//p:count")[0] == 2
    assert ws.cli("query", "//p:other").stdout.split() == ["//p:other"]  # as a command


def test_graph_formats(ws):
    _setup(ws)
    dot = ws.cli("graph", "//q/sub:uses", "--format", "dot").stdout
    assert dot.startswith("digraph qbuild {")
    assert '"//p:upper" -> "//p:src";' in dot
    mermaid = ws.cli("graph", "//p:count", "--format", "mermaid").stdout
    assert mermaid.startswith("graph LR")
    assert "-->" in mermaid and "//p:count (command)" in mermaid


def test_explain_names_the_exact_change(ws):
    _setup(ws)
    ws.cli("build", "//p:count")
    assert "is up to date" in ws.cli("explain", "//p:count").stdout
    ws.write("p/a.txt", "abd\n")
    out = ws.cli("explain", "//p:upper").stdout
    assert "//p:src would rebuild: input p/a.txt changed:" in out
    ws.write("p/a.txt", "abc\n")
    ws.write("p/BUILD.toml", PIPELINE.replace("tr a-z A-Z", "tr a-z A-Z "))
    out = ws.cli("explain", "//p:upper").stdout
    assert "attribute 'cmd': \"cat $(SRCS) | tr a-z A-Z > $(OUT)\" -> " in out
    built = ws.cli("build", "//p:count", "--explain")
    assert "//p:upper will run: attribute 'cmd'" in built.stderr


def test_clean_and_expunge(ws):
    _setup(ws)
    ws.cli("build", "//p:count")
    assert ws.cli("clean").code == 0
    assert not ws.path("qbuild-out").exists()
    again = ws.cli("build", "//p:count")
    assert "0 actions run, 3 cache hits" in again.stderr  # the cache survives clean
    assert ws.cli("clean", "--expunge").code == 0
    assert not ws.cache_dir.exists()
    assert "3 actions run" in ws.cli("build", "//p:count").stderr



def test_clean_with_a_symlinked_output_folder_empties_its_target_and_keeps_the_link(
        ws, tmp_path):
    _setup(ws)
    elsewhere = tmp_path / "other-disk" / "out"
    elsewhere.mkdir(parents=True)
    ws.path("qbuild-out").symlink_to(elsewhere)
    assert ws.cli("build", "//p:count").code == 0
    assert (elsewhere / "p" / "@count" / "n.txt").is_file()
    cleaned = ws.cli("clean")
    assert cleaned.code == 0, cleaned.stderr
    assert ws.path("qbuild-out").is_symlink() and elsewhere.is_dir()
    assert list(elsewhere.iterdir()) == []
    assert "link" in (cleaned.stdout + cleaned.stderr) and str(elsewhere) in (
        cleaned.stdout + cleaned.stderr)
    again = ws.cli("build", "//p:count")
    assert again.code == 0 and "0 actions run, 3 cache hits" in again.stderr, again.stderr
    assert (elsewhere / "p" / "@count" / "n.txt").read_text() == "4\n"

def test_cache_stats_and_gc(ws):
    _setup(ws)
    ws.cli("build", "//p:count", "//p:other")
    stats = ws.cli("cache", "stats").stdout
    assert "blobs: 7" in stats  # 4 outputs and the logs of the 3 commands (qbuild log)
    assert "actions: 4" in stats
    gc = ws.cli("cache", "gc", "--max-size", "0")
    assert gc.code == 0 and "removed" in gc.stdout
    ws.cli("clean")
    rebuilt = ws.cli("build", "//p:count")
    assert rebuilt.code == 0, rebuilt.stderr
    assert ws.path("qbuild-out/p/@count/n.txt").read_text() == "4\n"
    assert ws.cli("cache", "gc", "--max-size", "lots").code == 2


def test_rules_and_rule_help(ws):
    listing = ws.cli("rules").stdout
    assert "command" in listing and "filegroup" in listing
    help_text = ws.cli("rules", "command").stdout
    assert "rule command (version 1" in help_text
    assert "outs: list of strings (default: required)" in help_text
    assert "env: table (default: {})" in help_text
    assert ws.cli("rules", "nope").code == 2


def test_version(ws):
    import qbuild

    result = ws.cli("--version")
    assert result.code == 0 and result.stdout.strip() == f"qbuild {qbuild.__version__}"


def test_command_sandbox_holds_only_declared_inputs(ws):
    ws.write("p/a.txt", "a")
    ws.write("p/secret.txt", "s")
    ws.write("p/BUILD.toml", """
        [look]
        rule = "command"
        srcs = ["a.txt"]
        outs = ["ls.txt"]
        cmd = "ls p > $(OUT)"
    """)
    assert ws.cli("build", "//p:look").code == 0
    assert ws.path("qbuild-out/p/@look/ls.txt").read_text().split() == ["a.txt"]
