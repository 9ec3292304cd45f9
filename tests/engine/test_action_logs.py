"""Issue 26, point 5: an action's log is kept with its result, locally and on the remote
cache (a blob the result references, never part of a key), and ``qbuild log LABEL``
prints the last run's log of each action of a target."""

from __future__ import annotations

import pytest
from remote_servers import Wsgidav

from qbuild.store.local import LocalStore
from qbuild.testing import Workspace

BUILD = """
[talk]
rule = "command"
outs = ["t.txt"]
cmd = "echo {said}; echo done > $(OUT)"

[after]
rule = "command"
srcs = [":talk"]
outs = ["a.txt"]
cmd = "cp $(SRCS) $(OUT)"
"""


def test_qbuild_log_prints_the_log_of_a_successful_action_from_the_cache(qbuild_workspace):
    ws = qbuild_workspace
    ws.write("p/BUILD.toml", BUILD.format(said="hello from the action"))
    built = ws.build("//p:after")
    assert built.ok, built.error
    ws.cli("clean")  # the log lives in the cache, not in qbuild-out/
    out = ws.cli("log", "//p:talk")
    assert out.code == 0, out.stderr
    assert out.stdout.startswith("=== //p:talk: action Command ===\n")
    assert "hello from the action" in out.stdout


def test_the_log_is_not_in_the_key(qbuild_workspace):
    ws = qbuild_workspace
    ws.write("p/BUILD.toml", BUILD.format(said="one"))
    first = ws.build("//p:after")
    assert first.ok, first.error
    # a target whose log differs run to run (a timestamp) still gives its dependent a
    # cache hit: only outputs and providers reach keys
    ws.write("p/BUILD.toml", BUILD.format(said="$(date +%N)").replace(
        "[after]", "[other]\nrule = \"command\"\nouts = [\"o.txt\"]\ncmd = \"echo o > $(OUT)\""
        "\n\n[after]"))
    result = ws.build("//p:after")
    assert result.ok, result.error
    assert result.ran == ["//p:talk"] and result.cached == ["//p:after"]


def test_log_of_a_target_not_built_says_so_with_exit_1(qbuild_workspace):
    ws = qbuild_workspace
    ws.write("p/BUILD.toml", BUILD.format(said="x"))
    out = ws.cli("log", "//p:talk")
    assert out.code == 1
    assert out.stderr.strip() == ("qbuild log: //p:talk: action Command: not built: no "
                                  "cached result (qbuild build //p:talk)")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = Wsgidav(tmp_path_factory.mktemp("logs") / "root")
    yield srv
    srv.stop()


def test_the_log_travels_with_the_remote_entry(server, tmp_path):
    a = Workspace(tmp_path / "a", tmp_path / "cache-a")
    b = Workspace(tmp_path / "b", tmp_path / "cache-b")
    for ws in (a, b):
        ws.write("p/BUILD.toml", BUILD.format(said="made on machine a"))
    built = a.build("//p:talk", remote_cache=server.url)
    assert built.ok, built.error
    out = b.cli("log", "//p:talk", f"--remote_cache={server.url}")
    assert out.code == 0, out.stderr
    assert "made on machine a" in out.stdout
    store = LocalStore(b.cache_dir)  # b ran nothing: the log came from the server
    try:
        assert store.get_action(next(iter(_keys(a)))) is not None
    finally:
        store.close()


def _keys(ws: Workspace) -> list[str]:
    out = ws.cli("aquery", "//p:talk", "--output=json")
    import json

    return [r["key"] for r in json.loads(out.stdout)]
