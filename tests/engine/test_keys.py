"""What the action key covers: rule code (and code named at run time), qbuild's version,
the label, the dependency's output order, the command rule's tools; and what it leaves
out (nothing a rule can see)."""

import importlib
import importlib.util
import os
import sys
import textwrap
import time
from pathlib import Path

import pytest

import qbuild

PLUGIN = '''
from qbuild import Rule, attr, hookimpl

from . import helper


class Greet(Rule):
    kind = "greet"
    attrs = {"who": attr.string(default="world", doc="Whom.")}
    outputs = ["g.txt"]

    def run(self, ctx):
        ctx.output("g.txt").write_text(helper.greeting(ctx.attrs["who"]))
        return {}


class CallByName(Rule):
    kind = "call_by_name"
    attrs = {"fn": attr.string(required=True, doc="module:function")}
    outputs = ["c.txt"]

    def code(self, attrs):
        return [attrs["fn"]]

    def run(self, ctx):
        import importlib

        module, _, name = ctx.attrs["fn"].partition(":")
        ctx.output("c.txt").write_text(getattr(importlib.import_module(module), name)())
        return {}


@hookimpl
def qbuild_rule_types():
    return [Greet, CallByName]
'''


@pytest.fixture
def plugin(tmp_path, ws):
    """A plugin package (rules in __init__, a helper module) importable from tmp_path."""
    name = f"codekey_{os.getpid()}_{time.monotonic_ns()}"
    package = tmp_path / "plugins" / name
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(PLUGIN)
    (package / "helper.py").write_text("def greeting(who):\n    return f'hello {who}'\n")
    (tmp_path / "plugins" / f"{name}_named.py").write_text("def make():\n    return 'one'\n")
    sys.path.insert(0, str(tmp_path / "plugins"))
    module = importlib.import_module(name)
    ws.register(module)
    time.sleep(0.1)
    yield name, package
    sys.path.remove(str(tmp_path / "plugins"))
    for key in [k for k in sys.modules if k.startswith(name)]:
        del sys.modules[key]


def test_editing_a_rule_helper_module_reruns_the_action(ws, plugin):
    name, package = plugin
    ws.write("p/BUILD.toml", '[g]\nrule = "greet"\n')
    first = ws.build("//p:g")
    assert first.ok, first.error
    assert first.output("//p:g").read_text() == "hello world"
    assert ws.build("//p:g").ran == []
    # A change to a helper only (rule class, version and attributes untouched).
    (package / "helper.py").write_text("def greeting(who):\n    return f'goodbye {who}'\n")
    importlib.reload(sys.modules[f"{name}.helper"])
    second = ws.build("//p:g", explain=True)
    assert second.ran == ["//p:g"]
    assert second.output("//p:g").read_text() == "goodbye world"
    assert f"rule code changed: {name}/helper.py" in second.explanations["//p:g"]


def test_qbuild_explain_names_the_changed_code_file(ws, plugin):
    from qbuild.analysis.plugins import load_registry
    from qbuild.analysis.workspace import load_workspace
    from qbuild.build.session import Session
    from qbuild.commands.explain import explain
    from qbuild.core.labels import Label

    name, package = plugin
    ws.write("p/BUILD.toml", '[g]\nrule = "greet"\n')
    assert ws.build("//p:g").ok
    (package / "helper.py").write_text("def greeting(who):\n    return who\n")
    session = Session(load_workspace(ws.root), load_registry(ws.plugins))
    try:
        lines = explain(session, Label("p", "g"))
    finally:
        session.close()
    assert f"  rule code changed: {name}/helper.py" in lines, lines


def test_code_named_by_string_at_run_time_is_keyed(ws, plugin, tmp_path):
    name, _ = plugin
    ws.write("p/BUILD.toml", f'[c]\nrule = "call_by_name"\nfn = "{name}_named:make"\n')
    assert ws.build("//p:c").output("//p:c").read_text() == "one"
    named = tmp_path / "plugins" / f"{name}_named.py"
    named.write_text("def make():\n    return 'two'\n")
    # this process imports it afresh, as the next command's would (a same-size edit in
    # the second its .pyc was written: the keying drops that .pyc, after the reload here)
    Path(importlib.util.cache_from_source(str(named))).unlink(missing_ok=True)
    importlib.reload(importlib.import_module(f"{name}_named"))
    again = ws.build("//p:c")
    assert again.ran == ["//p:c"]
    assert again.output("//p:c").read_text() == "two"


def test_qbuild_version_is_keyed(ws, monkeypatch):
    ws.write("p/a.txt", "a")
    ws.write("p/BUILD.toml", '[a]\nrule = "concat"\nsrcs = ["a.txt"]\n')
    assert ws.build("//p:a").ran == ["//p:a"]
    monkeypatch.setattr("qbuild.core.versions.__version__", qbuild.__version__ + ".post1")
    again = ws.build("//p:a", explain=True)
    assert again.ran == ["//p:a"]
    assert any(line.startswith("qbuild: ") for line in again.explanations["//p:a"])


def test_targets_with_equal_attributes_never_share_label_dependent_outputs(ws):
    """$(OUT) and ctx.label differ between targets: each gets its own action."""
    ws.write("p/BUILD.toml", textwrap.dedent("""
        [a]
        rule = "command"
        cmd = "echo $(OUT) > $(OUT)"
        outs = ["x.txt"]

        [b]
        rule = "command"
        cmd = "echo $(OUT) > $(OUT)"
        outs = ["x.txt"]
    """))
    result = ws.build("//p:a", "//p:b")
    assert result.ok, result.error
    assert sorted(result.ran) == ["//p:a", "//p:b"]
    assert result.output("//p:a").read_text().strip() == "qbuild-out/p/@a/x.txt"
    assert result.output("//p:b").read_text().strip() == "qbuild-out/p/@b/x.txt"


def test_dependency_output_order_is_keyed(ws):
    """Reordering a dependency's outputs rebuilds it to the same bytes and info; a
    consumer reading its first file must still rerun."""
    build = '[fg]\nrule = "names"\nnames = {srcs}\n\n[first]\nrule = "concat"\ndeps = [":fg"]\n'
    ws.write("p/BUILD.toml", build.format(srcs='["a", "b"]'))
    assert ws.build("//p:first").output("//p:first").read_text() == "A"
    ws.write("p/BUILD.toml", build.format(srcs='["b", "a"]'))
    again = ws.build("//p:first")
    assert "//p:first" in again.ran
    assert again.output("//p:first").read_text() == "B"


def _tool(directory, text):
    directory.mkdir(parents=True, exist_ok=True)
    tool = directory / "qbtool"
    tool.write_text(f"#!/bin/sh\necho {text}\n")
    tool.chmod(0o755)
    return tool


def test_command_tools_on_path_are_keyed(ws, tmp_path, monkeypatch):
    one, two = tmp_path / "bin1", tmp_path / "bin2"
    _tool(one, "one")
    _tool(two, "two")
    ws.write("p/BUILD.toml", '[t]\nrule = "command"\ncmd = "qbtool > $(OUT)"\nouts = ["o"]\n')
    base = os.environ.get("PATH", "/usr/bin:/bin")
    monkeypatch.setenv("PATH", f"{one}:{base}")
    assert ws.build("//p:t").output("//p:t").read_text() == "one\n"
    monkeypatch.setenv("PATH", f"{two}:{base}")
    second = ws.build("//p:t")
    assert second.ran == ["//p:t"]
    assert second.output("//p:t").read_text() == "two\n"
    # The same PATH with the tool edited in place also misses.
    _tool(two, "three")
    third = ws.build("//p:t")
    assert third.ran == ["//p:t"]
    assert third.output("//p:t").read_text() == "three\n"
    monkeypatch.setenv("LANG", "C.UTF-8" if os.environ.get("LANG") != "C.UTF-8" else "C")
    assert ws.build("//p:t").ran == ["//p:t"]


def test_command_home_and_tmpdir_are_private(ws, tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    (home / "secret").write_text("s")
    monkeypatch.setenv("HOME", str(home))
    ws.write("p/BUILD.toml", '[t]\nrule = "command"\n'
             'cmd = "ls -A $HOME | wc -l > $(OUT); touch $TMPDIR/x"\nouts = ["o"]\n')
    result = ws.build("//p:t")
    assert result.ok, result.error
    assert result.output("//p:t").read_text().strip() == "0"


def test_output_folders_are_injective_and_never_nested(ws):
    from qbuild import output_folder

    labels = ["//:foo", "//foo:bar", "//foo/bar:x", "//foo:foo", "//a/b:c", "//a:b@k=1"]
    folders = [output_folder(label) for label in labels]
    assert len(set(folders)) == len(folders)
    for one in folders:
        for other in folders:
            assert one == other or not other.startswith(one + "/"), (one, other)
    ws.write("BUILD.toml", '[foo]\nrule = "concat"\nsrcs = ["r.txt"]\n')
    ws.write("r.txt", "root")
    ws.write("foo/BUILD.toml", '[bar]\nrule = "concat"\nsrcs = ["s.txt"]\n')
    ws.write("foo/s.txt", "sub")
    both = ws.build("//:foo", "//foo:bar")
    assert both.ok, both.error
    assert both.output("//:foo").read_text() == "root"
    assert both.output("//foo:bar").read_text() == "sub"
    again = ws.build("//:foo")  # materializing one target keeps the other's files
    assert again.ok
    assert both.output("//foo:bar").read_text() == "sub"


def test_float_attribute_defaults_are_floats(ws):
    """``attr.float(default=1)`` and ``x = 1`` both reach the rule (and key) as 1.0."""
    import toy_rules

    assert toy_rules.FloatEcho.attrs["x"].default == 1
    ws.write("p/BUILD.toml", '[d]\nrule = "float_echo"\n\n[e]\nrule = "float_echo"\nx = 1\n')
    result = ws.build("//p:d", "//p:e")
    assert result.ok, result.error
    assert result.output("//p:d").read_text() == "1.0 [2.0]"
    assert result.output("//p:e").read_text() == "1.0 [2.0]"


def test_the_command_line_sees_a_different_tool_on_path(ws, tmp_path):
    """Also through the no-op fast path: a PATH change takes the full path."""
    one, two = tmp_path / "bin1", tmp_path / "bin2"
    _tool(one, "one")
    _tool(two, "two")
    ws.write("p/BUILD.toml", '[t]\nrule = "command"\ncmd = "qbtool > $(OUT)"\nouts = ["o"]\n')
    base = os.environ.get("PATH", "/usr/bin:/bin")
    out = ws.path("qbuild-out/p/@t/o")
    assert ws.cli("build", "//p:t", env={"PATH": f"{one}:{base}"}).code == 0
    assert out.read_text() == "one\n"
    assert ws.cli("build", "//p:t", env={"PATH": f"{one}:{base}"}).code == 0
    assert ws.cli("build", "//p:t", env={"PATH": f"{two}:{base}"}).code == 0
    assert out.read_text() == "two\n"


def test_bytecode_python_would_trust_after_a_same_size_edit_is_dropped(tmp_path):
    """A .pyc names its source's size and mtime in whole seconds: an edit keeping both
    would run the old code under the new code's key, so keying drops that .pyc."""
    import importlib.util
    import py_compile

    from qbuild.keys.code import drop_stale_bytecode

    source = tmp_path / "rule_code.py"
    source.write_text("VALUE = 'one'\n")
    cached = Path(py_compile.compile(str(source), doraise=True,
                                     invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP))
    assert cached == Path(importlib.util.cache_from_source(str(source)))
    written = os.stat(cached).st_mtime_ns
    source.write_text("VALUE = 'two'\n")  # same size
    os.utime(source, ns=(written, written))  # the same clock tick as the .pyc
    drop_stale_bytecode(str(source), os.stat(source))
    assert not cached.exists()
    # a .pyc written after the source's last change is kept
    cached = Path(py_compile.compile(str(source), doraise=True,
                                     invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP))
    later = os.stat(cached).st_mtime_ns
    os.utime(source, ns=(later - 1_000_000, later - 1_000_000))
    os.utime(cached, ns=(later, later))
    drop_stale_bytecode(str(source), os.stat(source))
    assert cached.exists()
