"""The shared remote cache (Bazel's HTTP protocol) against real servers on 127.0.0.1:
wsgidav (always) and Debian's nginx with WebDAV PUT (skipped when not installed).

Two workspaces with separate local caches share one server; the second builds with no
action run, byte-identical outputs, and downloads only what it must read.
"""

from __future__ import annotations

import hashlib
import json

import pytest
import toy_rules
from remote_servers import Nginx, Wsgidav, nginx_binary

from qbuild.store.local import LocalStore
from qbuild.testing import Workspace

GRAPH = """
[one]
rule = "concat"
srcs = ["a.txt", "b.txt"]

[two]
rule = "concat"
deps = [":one"]
upper = true

[top]
rule = "concat"
deps = [":two"]
sep = "-"
repeat = 2

[side]
rule = "length"
dep = ":one"
"""


def make(tmp_path, name: str) -> Workspace:
    ws = Workspace(tmp_path / name, tmp_path / f"cache-{name}")
    ws.register(toy_rules)
    ws.write("p/a.txt", "alpha\n")
    ws.write("p/b.txt", "beta\n")
    ws.write("p/BUILD.toml", GRAPH)
    return ws


@pytest.fixture(scope="module", params=["wsgidav", "nginx"])
def server_process(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    if request.param == "nginx":
        if nginx_binary() is None:
            pytest.skip("nginx is not installed (apt-get install nginx; .ci/run installs it "
                        "when it runs as root)")
        srv = Nginx(root / "root")
    else:
        srv = Wsgidav(root / "root")
    yield srv
    srv.stop()


class Namespace:
    """One test's own part of a shared server: a URL prefix and its folder."""

    def __init__(self, process, name: str) -> None:
        self.kind = process.kind
        self.root = process.root / name
        (self.root / "ac").mkdir(parents=True)
        (self.root / "cas").mkdir()
        self.url = f"{process.url}/{name}"

    def files(self, kind: str):
        return sorted(p for p in (self.root / kind).iterdir() if p.is_file())


@pytest.fixture
def server(server_process, request):
    return Namespace(server_process, request.node.name.replace("[", "-").rstrip("]"))


def local_blob(ws: Workspace, digest: str) -> bool:
    store = LocalStore(ws.cache_dir)
    try:
        return store.has_blob(digest)
    finally:
        store.close()


def test_second_workspace_builds_nothing_and_gets_identical_bytes(server, tmp_path):
    a, b = make(tmp_path, "a"), make(tmp_path, "b")
    first = a.build("//p:top", "//p:side", remote_cache=server.url)
    assert first.ok, first.error
    assert sorted(first.ran) == ["//p:one", "//p:side", "//p:top", "//p:two"]
    assert first.remote["results_uploaded"] == 4 and "WARNING" not in first.log

    second = b.build("//p:top", "//p:side", remote_cache=server.url)
    assert second.ok, second.error
    assert second.ran == [] and "WARNING" not in second.log
    assert sorted(second.remote_hits) == ["//p:one", "//p:side", "//p:top", "//p:two"]
    for label in ("//p:top", "//p:side"):
        assert second.output(label).read_bytes() == first.output(label).read_bytes()
    assert second.info("//p:side") == first.info("//p:side")
    # Build without the bytes: intermediates were not downloaded, requested outputs were.
    one = hashlib.sha256(b"alpha\nbeta\n").hexdigest()
    assert not local_blob(b, one)
    assert local_blob(b, hashlib.sha256(second.output("//p:top").read_bytes()).hexdigest())
    assert second.remote["blobs_downloaded"] == 2

    third = b.build("//p:top", "//p:side", remote_cache=server.url)
    assert third.ran == [] and third.remote_hits == [] and third.remote["hits"] == 0


def test_action_results_are_reapi_json_and_reference_stored_blobs(server, tmp_path):
    a = make(tmp_path, "a")
    assert a.build("//p:top", remote_cache=server.url).ok
    entries = server.files("ac")
    assert len(entries) == 3
    cas = {p.name: p for p in server.files("cas")}
    for entry in entries:
        result = json.loads(entry.read_bytes())
        assert set(result) == {"outputFiles"}
        paths = [f["path"] for f in result["outputFiles"]]
        assert ".qbuild/result.json" in paths
        for item in result["outputFiles"]:
            digest = item["digest"]
            assert set(digest) == {"hash", "sizeBytes"}
            blob = cas[digest["hash"]].read_bytes()
            assert hashlib.sha256(blob).hexdigest() == digest["hash"]
            assert len(blob) == int(digest["sizeBytes"])
            if item["path"] == ".qbuild/result.json":
                meta = json.loads(blob)
                assert meta["declared"] == ["out.txt"] and "components" in meta


def test_changing_only_the_top_downloads_just_the_inputs_it_reads(server, tmp_path):
    a, b = make(tmp_path, "a"), make(tmp_path, "b")
    assert a.build("//p:top", remote_cache=server.url).ok
    b.write("p/BUILD.toml", GRAPH.replace('sep = "-"', 'sep = "+"'))
    result = b.build("//p:top", remote_cache=server.url)
    assert result.ok, result.error
    assert result.ran == ["//p:top"]
    assert sorted(result.remote_hits) == ["//p:one", "//p:two"]
    two = hashlib.sha256(b"ALPHA\nBETA\n").hexdigest()
    one = hashlib.sha256(b"alpha\nbeta\n").hexdigest()
    assert local_blob(b, two) and not local_blob(b, one)
    assert result.output("//p:top").read_text() == "ALPHA\nBETA\nALPHA\nBETA\n"


def test_an_entry_whose_blob_is_gone_is_a_miss(server, tmp_path):
    a, b = make(tmp_path, "a"), make(tmp_path, "b")
    first = a.build("//p:top", remote_cache=server.url)
    assert first.ok
    top = hashlib.sha256(first.output("//p:top").read_bytes()).hexdigest()
    (server.root / "cas" / top).unlink()
    result = b.build("//p:top", remote_cache=server.url)
    assert result.ok, result.error
    assert result.ran == ["//p:top"] and sorted(result.remote_hits) == ["//p:one", "//p:two"]
    assert result.output("//p:top").read_bytes() == first.output("//p:top").read_bytes()


def test_directory_outputs_round_trip(server, tmp_path):
    a, b = make(tmp_path, "a"), make(tmp_path, "b")
    for ws in (a, b):
        ws.write("t/BUILD.toml", '[tree]\nrule = "tree"\nn = 3\n')
    first = a.build("//t:tree", remote_cache=server.url)
    second = b.build("//t:tree", remote_cache=server.url)
    assert second.ok and second.ran == [] and second.remote_hits == ["//t:tree"]
    out = second.output("//t:tree")
    assert sorted(p.name for p in out.iterdir()) == ["f0.txt", "f1.txt", "f2.txt"]
    assert (out / "f2.txt").read_bytes() == (first.output("//t:tree") / "f2.txt").read_bytes()


def test_read_only_jobs_upload_nothing(server, tmp_path):
    a, b = make(tmp_path, "a"), make(tmp_path, "b")
    result = a.build("//p:top", remote_cache=server.url, remote_upload=False)
    assert result.ok and result.remote["bytes_uploaded"] == 0
    assert server.files("ac") == [] and server.files("cas") == []
    assert b.build("//p:top", remote_cache=server.url).ran == ["//p:one", "//p:two", "//p:top"]


def test_remote_cache_from_qbuild_toml(server, tmp_path):
    a, b = make(tmp_path, "a"), make(tmp_path, "b")
    for ws in (a, b):
        text = ws.path("qbuild.toml").read_text()
        ws.write("qbuild.toml", text + f'\n[remote]\ncache = "{server.url}"\ntimeout = 30\n')
    assert a.build("//p:top").ok
    assert b.build("//p:top").remote_hits == ["//p:one", "//p:two", "//p:top"]


CLI_GRAPH = """
[gen]
rule = "command"
srcs = ["in.txt"]
outs = ["gen.txt"]
cmd = "tr a-z A-Z < $(SRCS) > $(OUT)"

[final]
rule = "command"
srcs = [":gen"]
outs = ["final.txt"]
cmd = "cat $(SRCS) $(SRCS) > $(OUT)"
"""


def test_cli_event_log_and_explain_say_where_results_came_from(server, tmp_path):
    if server.kind != "wsgidav":
        pytest.skip("the command line is the same for every server; once is enough")
    a, b = make(tmp_path, "a"), make(tmp_path, "b")
    for ws in (a, b):
        ws.write("c/in.txt", "shared cache\n")
        ws.write("c/BUILD.toml", CLI_GRAPH)
    env = {"QBUILD_REMOTE_CACHE": server.url}
    assert a.cli("build", "//c:final", env=env).code == 0

    explained = b.cli("explain", "//c:final", env=env)
    assert "would be served from the remote cache" in explained.stdout, explained.stdout
    events = tmp_path / "events.jsonl"
    built = b.cli("build", "//c:final", f"--event_log={events}", env=env)
    assert built.code == 0, built.stderr
    assert "2 from the remote cache" in built.stderr
    records = [json.loads(line) for line in events.read_text().splitlines()]
    origins = {r["label"]: r["origin"] for r in records if r["event"] == "action_finished"}
    assert origins == {"//c:gen": "remote_cache", "//c:final": "remote_cache"}
    finished = records[-1]
    assert finished["remote"]["hits"] == 2 and finished["remote"]["bytes_downloaded"] > 0
    assert (b.path("qbuild-out/c/@final/final.txt").read_bytes()
            == a.path("qbuild-out/c/@final/final.txt").read_bytes())
    assert "came from the remote cache" in b.cli("explain", "//c:final").stdout

    b.write("c/in.txt", "changed here\n")
    built = b.cli("build", "//c:final", f"--event_log={events}", "--remote_cache=", env=env)
    records = [json.loads(line) for line in events.read_text().splitlines()]
    origins = {r["label"]: r["origin"] for r in records if r["event"] == "action_finished"}
    assert origins == {"//c:gen": "ran", "//c:final": "ran"}
    assert "remote" not in records[-1]
    assert "was built on this machine" in b.cli("explain", "//c:final").stdout


def test_v2_providers_and_per_action_results_round_trip(server, tmp_path):
    """A v2 target's providers come back from the remote cache typed, and another
    workspace whose report-only setting differs reuses the remote first action."""
    import toy_rules_v2
    from toy_rules_v2 import ReportInfo, TextInfo

    def v2(name, title):
        ws = make(tmp_path, name)
        ws.register(toy_rules_v2)
        ws.write("p/BUILD.toml", f'[w]\nrule = "summarize"\nsrcs = ["a.txt"]\ntitle = "{title}"\n'
                 '[all]\nrule = "consume"\ntexts = [":w"]\n')
        return ws

    first = v2("a", "t").build("//p:all", "//p:w", remote_cache=server.url)
    assert first.ok, first.error
    second = v2("b", "t").build("//p:all", "//p:w", remote_cache=server.url)
    assert second.ok and second.ran == [], second.error
    assert second.provider("//p:w", TextInfo).words == 1
    assert second.provider("//p:w", ReportInfo).title == "t"
    assert second.output("//p:all").read_text() == first.output("//p:all").read_text()
    third = v2("c", "other").build("//p:w", remote_cache=server.url)
    assert third.ok, third.error
    assert third.actions["//p:w"] == {"Transform": "cached", "Report": "ran"}
