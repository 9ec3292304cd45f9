"""Bad input gets one clear message naming file, target and attribute, and exit code 2."""

import pytest


@pytest.mark.parametrize(
    ("build_file", "pattern", "expected"),
    [
        ('[a]\nrule = "concat"\nsrcs = [\n', "//p:a", "p/BUILD.toml:4:1: TOML syntax error"),
        ('[a]\nrule = "nope"\n', "//p:a", "target //p:a, attribute 'rule': unknown rule 'nope'"),
        ('[a]\nrule = "concat"\ncolour = 1\n', "//p:a",
         "target //p:a, attribute 'colour': unknown attribute for rule 'concat'"),
        ('[a]\nrule = "length"\n', "//p:a", "attribute 'dep': missing required attribute"),
        ('[a]\nrule = "concat"\nrepeat = "two"\n', "//p:a",
         "attribute 'repeat': expected an integer, got a string"),
        ('[a]\nrule = "concat"\nmode = "odd"\n', "//p:a",
         "attribute 'mode': expected one of 'plain', 'fancy', got 'odd'"),
        ('[a]\nrule = "concat"\ndeps = ["//p:b:c"]\n', "//p:a", "malformed label '//p:b:c'"),
        ('[a]\nrule = "concat"\ndeps = ["//../x:y"]\n', "//p:a", "escapes the workspace"),
        ('[a]\nrule = "concat"\nsrcs = ["../secret.txt"]\n', "//p:a", "leaves the package"),
        ('[a]\nrule = "concat"\nsrcs = ["missing.txt"]\n', "//p:a",
         "attribute 'srcs': source file 'missing.txt' does not exist"),
        ('[a]\nrule = "concat"\nsrcs = ["*.onnx"]\n', "//p:a", "glob '*.onnx' matches no files"),
        ('[a]\nrule = "concat"\ndeps = [":b"]\n[b]\nrule = "concat"\ndeps = [":a"]\n', "//p:a",
         "dependency cycle: //p:a -> //p:b -> //p:a"),
        ('[a]\nrule = "concat"\ndeps = [":zz"]\n', "//p:a",
         "attribute 'deps': no target 'zz' in package '//p'"),
        ('[a]\nrule = "concat"\n', "//p:nothere", "no target 'nothere' in package '//p'"),
        ('[a]\nrule = "concat"\n', "//q:a", "no package '//q'"),
        ('x = 1\n', "//p:x", "top-level key 'x' is not a target table"),
        ('[a]\nsrcs = []\n', "//p:a", "missing 'rule'"),
    ],
)
def test_bad_build_files_get_one_clear_message(ws, build_file, pattern, expected):
    ws.write("p/BUILD.toml", build_file)
    result = ws.build(pattern)
    assert result.exit_code == 2
    assert expected in result.error
    assert "p/BUILD.toml" in result.error or "//q" in result.error


def test_cli_error_has_no_traceback_unless_verbose(ws):
    ws.write("p/BUILD.toml", '[a]\nrule = "command"\ncmd = "true"\nouts = ["x"]\nsrcs = 3\n')
    plain = ws.cli("build", "//p:a")
    assert plain.code == 2
    assert plain.stderr.strip().splitlines() == [
        "ERROR: p/BUILD.toml, target //p:a, attribute 'srcs': expected a list of files "
        "(globs allowed) or labels, got an integer"]
    verbose = ws.cli("build", "//p:a", "--verbose")
    assert "Traceback" in verbose.stderr


def test_failed_build_exit_code_is_1_and_keeps_the_cache(ws):
    ws.write("p/BUILD.toml", """
        [ok]
        rule = "command"
        cmd = "echo fine > $(OUT)"
        outs = ["ok.txt"]

        [bad]
        rule = "command"
        cmd = "echo 'about to fail'; exit 3"
        outs = ["bad.txt"]
    """)
    result = ws.cli("build", "//p:ok", "//p:bad", "--keep_going")
    assert result.code == 1
    assert "FAILED: //p:bad" in result.stderr
    assert "command exited with status 3" in result.stderr
    assert "| about to fail" in result.stderr
    again = ws.cli("build", "//p:ok")
    assert again.code == 0
    assert "0 actions run, 1 cache hits" in again.stderr


def test_usage_errors_exit_2(ws):
    assert ws.cli("build").code == 2
    assert ws.cli("frobnicate").code == 2
    result = ws.cli("build", "not-a-label")
    assert result.code == 2 and "malformed label" in result.stderr


def test_outside_a_workspace_is_a_clear_error(tmp_path):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "qbuild", "build", "//..."], cwd=tmp_path,
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "not inside a qbuild workspace" in proc.stderr


def test_duplicate_rule_kinds_name_both_providers(ws):
    import types

    from qbuild import Rule, hookimpl

    class Again(Rule):
        kind = "concat"

    clash = types.ModuleType("clash_plugin")
    clash.qbuild_rule_types = hookimpl(lambda: [Again])
    ws.register(clash)
    ws.write("p/BUILD.toml", '[a]\nrule = "concat"\n')
    result = ws.build("//p:a")
    assert result.exit_code == 2
    assert "rule kind 'concat' is provided twice" in result.error
    assert "toy_rules" in result.error and "clash_plugin" in result.error
