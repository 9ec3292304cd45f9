"""Macro rules: a rule with expand_targets adds ordinary, separately cached targets to its
package; an attribute only the macro target reads reruns only that target."""

BUILD = """
[m]
rule = "twice"
srcs = ["a.txt"]
sep = "{sep}"
"""


def test_macro_targets_are_ordinary_and_cached(ws):
    ws.write("p/a.txt", "ab")
    ws.write("p/BUILD.toml", BUILD.format(sep="|"))
    r = ws.build("//p:m")
    assert r.ok, r.error
    assert r.outputs("//p:m")[0].read_text() == "ab|AB"
    assert set(r.ran) == {"//p:m", "//p:m.first", "//p:m.second"}
    assert ws.build("//p:m.second").ran == []  # a generated target is addressable
    ws.write("p/BUILD.toml", BUILD.format(sep="+"))
    again = ws.build("//p:m")
    assert again.ran == ["//p:m"]
    assert again.outputs("//p:m")[0].read_text() == "ab+AB"
    ws.write("p/a.txt", "cd")
    assert set(ws.build("//p:m").ran) == {"//p:m", "//p:m.first", "//p:m.second"}


def test_macro_config_error_names_file_target_and_attribute(ws):
    ws.write("p/a.txt", "ab")
    ws.write("p/BUILD.toml", BUILD.format(sep="|") + 'parts = [":x"]\n')
    r = ws.build("//p:m")
    assert r.exit_code == 2
    assert "p/BUILD.toml" in r.error and "//p:m" in r.error and "'parts'" in r.error



def test_package_pattern_includes_generated_targets(ws):
    ws.write("p/a.txt", "ab")
    ws.write("p/BUILD.toml", BUILD.format(sep="|"))
    r = ws.build("//p:all")
    assert r.ok, r.error
    assert {"//p:m", "//p:m.first", "//p:m.second"} <= set(r.ran)
