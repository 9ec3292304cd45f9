"""Rule API v2: typed providers checked at analysis, actions declared at analysis and
cached one by one (a report-only change reruns only the report), no label in actions."""

import toy_rules_v2
from toy_rules_v2 import ReportInfo, TextInfo

BUILD = """
[words]
rule = "summarize"
srcs = ["a.txt"]
title = "{title}"
upper = {upper}

[all]
rule = "consume"
texts = [":words", ":legacy"]

[legacy]
rule = "legacy_text"
srcs = ["a.txt"]

[plain]
rule = "concat"
srcs = ["a.txt"]

[files]
rule = "filegroup"
srcs = ["a.txt"]
"""


def setup(ws, title="first", upper="false"):
    ws.register(toy_rules_v2)
    ws.write("p/a.txt", "one two\nthree\n")
    ws.write("p/BUILD.toml", BUILD.format(title=title, upper=upper))


def test_report_only_param_reruns_only_the_report(ws):
    setup(ws)
    first = ws.build("//p:words")
    assert first.ok, first.error
    assert first.actions["//p:words"] == {"Transform": "ran", "Report": "ran"}
    assert ws.build("//p:words").ran == []
    setup(ws, title="second")
    second = ws.build("//p:words")
    assert second.ok, second.error
    assert second.ran == ["//p:words"]
    assert second.actions["//p:words"] == {"Transform": "cached", "Report": "ran"}
    report = second.provider("//p:words", ReportInfo)
    assert report.title == "second"
    assert report.report.read_text() == "second: 2 lines\n"
    setup(ws, title="second", upper="true")
    third = ws.build("//p:words")
    assert third.actions["//p:words"] == {"Transform": "ran", "Report": "ran"}
    assert third.provider("//p:words", TextInfo).text.read_text() == "ONE TWO\nTHREE\n"
    setup(ws)  # back to the first settings: the target's result is still cached
    assert ws.build("//p:words").ran == []


def test_providers_reach_dependents_typed(ws):
    setup(ws)
    result = ws.build("//p:all")
    assert result.ok, result.error
    # Paths resolve in the dependent's sandbox; actions never see a label.
    assert result.output("//p:all").read_text().splitlines() == [
        "3 one two|three True ''", "3 one two|three False ''"]


def test_v1_rule_returning_a_provider_keeps_its_info(ws):
    setup(ws)
    result = ws.build("//p:legacy")
    assert result.ok, result.error
    assert result.info("//p:legacy") == {"legacy": True}
    info = result.provider("//p:legacy", TextInfo)
    assert info.words == 3 and info.text == result.output("//p:legacy")
    assert info.lines == ()


def test_wrong_provider_fails_at_analysis_before_anything_runs(ws):
    setup(ws)
    ws.write("q/BUILD.toml", """
        [bad]
        rule = "consume"
        texts = ["//p:words", "//p:files"]
    """)
    result = ws.build("//p:words", "//q:bad")
    assert result.exit_code == 2
    assert result.ran == [] and result.cached == []
    assert result.error == (
        "q/BUILD.toml, target //q:bad, attribute 'texts': //p:files (rule 'filegroup') does "
        "not provide TextInfo (it provides: DefaultInfo)")
    # (The CLI's exit 2 and single line: tests/engine/test_v2_example_plugin.py.)


def test_a_v1_rule_declaring_no_providers_is_checked_when_its_action_runs(ws):
    """Rules that predate providers (v1, no ``provides``) are not refused at analysis;
    asking them for a provider fails the dependent's action, naming what they give."""
    setup(ws)
    ws.write("q/BUILD.toml", """
        [old]
        rule = "consume"
        texts = ["//p:plain"]
    """)
    result = ws.build("//q:old")
    assert result.exit_code == 1
    assert "gives no TextInfo (it gives: DefaultInfo)" in result.error


def test_same_action_in_another_package_is_shared(ws):
    """No label in an action's key: the same sources and params in another package hit."""
    setup(ws)
    assert ws.build("//p:words").ok
    ws.write("r/a.txt", "one two\nthree\n")
    ws.write("r/BUILD.toml", BUILD.format(title="first", upper="false"))
    other = ws.build("//r:words")
    assert other.ok, other.error
    assert other.ran == ["//r:words"]  # its own target key (label) missed...
    assert other.actions["//r:words"] == {"Transform": "cached", "Report": "cached"}


def test_failing_action_names_target_and_action(ws):
    setup(ws)
    ws.write("p/BUILD.toml", BUILD.format(title="t", upper="false").replace(
        'upper = false', 'upper = false\nfail = true', 1))
    result = ws.build("//p:words")
    assert result.exit_code == 1
    assert "//p:words" in result.error and "action Transform: asked to fail" in result.error


def test_aquery_lists_actions_inputs_outputs_and_keys(ws):
    setup(ws)
    before = ws.aquery("//p:words", "//p:plain")
    assert [(r["target"], r["mnemonic"]) for r in before] == [
        ("//p:words", "Transform"), ("//p:words", "Report"), ("//p:plain", "concat")]
    transform, report, plain = before
    assert transform["inputs"] == [{"name": "srcs", "labels": [], "sources": ["p/a.txt"]}]
    assert transform["outputs"] == ["p/@words/words.txt"]
    assert transform["params"] == {"upper": False, "fail": False}
    assert report["inputs"] == [{"name": "words.txt", "output": "p/@words/words.txt"}]
    assert report["params"] == {"title": "first"}
    # Nothing built: the transform's key is known from its inputs, the report's is not.
    assert transform["key"] and not transform["cached"]
    assert report["key"] is None
    # A rule with ``run`` declares one action, named after its kind, calling ``run``.
    assert plain["key"] and plain["function"] == "qbuild.api.rule:run_rule"
    built = ws.build("//p:words", "//p:plain")
    assert built.ok, built.error
    after = ws.aquery("//p:words", "//p:plain")
    assert after[0]["key"] == transform["key"] and after[0]["cached"]
    assert after[1]["key"] and after[1]["cached"]
    assert after[2]["key"] == plain["key"] and after[2]["cached"]
    setup(ws, title="other")
    changed = ws.aquery("//p:words")
    assert changed[0]["key"] == transform["key"] and changed[0]["cached"]
    assert changed[1]["key"] != after[1]["key"] and not changed[1]["cached"]


def test_an_action_whose_cached_blobs_are_gone_runs_again(ws):
    """A step hit is used only with its blobs: an evicted output makes that action run
    (and only it), never a failure or a stale file."""
    import hashlib
    import os

    from qbuild.store.local import LocalStore

    setup(ws)
    first = ws.build("//p:words")
    assert first.ok, first.error
    text = first.outputs("//p:words")[0].read_bytes()
    store = LocalStore(ws.cache_dir)
    try:
        blob = store._blob_path(hashlib.sha256(text).hexdigest())
    finally:
        store.close()
    os.chmod(blob, 0o644)
    os.unlink(blob)
    setup(ws, title="again")
    second = ws.build("//p:words")
    assert second.ok, second.error
    assert second.actions["//p:words"] == {"Transform": "ran", "Report": "ran"}
    assert second.outputs("//p:words")[0].read_bytes() == text


def test_a_declared_provider_must_be_returned(ws):
    setup(ws)
    ws.write("f/BUILD.toml", '[v1]\nrule = "forgetful_v1"\n[v2]\nrule = "forgetful_v2"\n')
    result = ws.build("//f:v1", "//f:v2", keep_going=True)
    assert result.exit_code == 1
    assert "returned the declared provider(s) TextInfo" in result.failed["//f:v1"]
    assert "no action returned the declared provider(s) TextInfo" in result.failed["//f:v2"]


def test_aquery_text_says_when_an_action_writes_nothing():
    from qbuild.commands.aquery import as_text

    record = {"mnemonic": "CheckBars", "target": "//p:ev", "function": "m:check",
              "inputs": [], "outputs": [], "params": {}, "key": None, "cached": False}
    assert "  outputs: (none: a check)\n" in as_text([record])
