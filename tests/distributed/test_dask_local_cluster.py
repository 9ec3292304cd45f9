"""Remote execution on a ``distributed.LocalCluster`` (two worker processes) with a
wsgidav cache: outputs byte-identical to a local build, intermediates left on the server,
a worker killed mid-action survived, an unreachable scheduler reported or fallen back
from."""

from __future__ import annotations

import os
import signal
import threading
import time

import dist_rules
import toy_rules

from qbuild.store.local import LocalStore
from qbuild.testing import Workspace

GRAPH = """
[one]
rule = "concat"
srcs = ["a.txt", "b.txt"]

[two]
rule = "heavy_concat"
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
    ws.register(dist_rules)
    ws.write("p/a.txt", "alpha\n")
    ws.write("p/b.txt", "beta\n")
    ws.write("p/BUILD.toml", GRAPH)
    return ws


def _prefix(server, tmp_path) -> str:
    name = tmp_path.name
    (server.root / name / "ac").mkdir(parents=True)
    (server.root / name / "cas").mkdir()
    return f"{server.url}/{name}"


def _address(cluster) -> str:
    return "dask://" + cluster.scheduler_address.removeprefix("tcp://")


def test_builds_on_the_cluster_byte_identical_to_local(tmp_path, cache_server, local_cluster):
    here = make(tmp_path, "here")
    local = here.build("//p:top", "//p:side")
    assert local.ok, local.error
    there = make(tmp_path, "there")
    url = _prefix(cache_server, tmp_path)
    remote = there.build("//p:top", "//p:side", remote_cache=url,
                         remote_executor=_address(local_cluster), strategy=["*=remote"])
    assert remote.ok, remote.error + remote.log
    assert sorted(remote.ran) == ["//p:one", "//p:side", "//p:top", "//p:two"]
    executed = remote.remote_execution
    assert executed["remote_actions"] == 4 and executed["local_actions"] == 0
    workers = set(executed["workers"])
    assert workers <= set(local_cluster.scheduler_info["workers"])
    assert " on tcp://127.0.0.1:" in remote.log  # progress names the worker
    for label in ("//p:top", "//p:side"):
        for mine, theirs in zip(local.outputs(label), remote.outputs(label)):
            assert mine.read_bytes() == theirs.read_bytes()
            assert mine.name == theirs.name
    # Build without the bytes: the client holds the requested outputs, not //p:one's.
    store = LocalStore(there.cache_dir)
    try:
        held = set(store.blob_digests())
    finally:
        store.close()
    here_store = LocalStore(here.cache_dir)
    try:
        digests = {label: {e.digest for e in here_store.get_action(key).outputs}
                   for label, key in _last_keys(here).items()}
    finally:
        here_store.close()
    assert digests["//p:top"] <= held and digests["//p:side"] <= held
    assert not digests["//p:one"] & held and not digests["//p:two"] & held
    # Light rules stay here by default: only the heavy one goes to the cluster.
    again = make(tmp_path, "default")
    default = again.build("//p:top", remote_cache=url, remote_executor=_address(local_cluster))
    assert default.ok and default.remote_hits  # the same keys: served by the cache


def _last_keys(ws: Workspace) -> dict[str, str]:
    from qbuild.build.state import WorkspaceState

    return WorkspaceState(ws.path("qbuild-out")).last_keys


def test_light_actions_stay_local_by_default(tmp_path, cache_server, local_cluster):
    ws = make(tmp_path, "ws")
    ws.write("p/a.txt", "gamma\n")  # new keys: nothing cached
    outcome = ws.build("//p:top", remote_cache=_prefix(cache_server, tmp_path),
                       remote_executor=_address(local_cluster))
    assert outcome.ok, outcome.error
    executed = outcome.remote_execution
    assert executed["remote_actions"] == 1 and executed["local_actions"] == 2


def test_progress_of_an_action_on_a_worker_reaches_the_client(tmp_path, cache_server,
                                                              local_cluster):
    from qbuild.core import live

    release = tmp_path / "release"
    ws = make(tmp_path, "ws")
    ws.write("g/BUILD.toml", f'[long]\nrule = "progress"\nrelease = "{release}"\n')
    outcome = {}

    def build() -> None:
        outcome["result"] = ws.build("//g:long", remote_cache=_prefix(cache_server, tmp_path),
                                     remote_executor=_address(local_cluster))

    thread = threading.Thread(target=build)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        # what the console's live line shows for the running action (ctx.progress)
        while live.read("//g:long") != (2, 5):
            assert time.monotonic() < deadline and thread.is_alive(), \
                "the worker's progress never reached the client"
            time.sleep(0.02)
    finally:
        release.touch()
    thread.join(120)
    result = outcome["result"]
    assert result.ok, result.error + result.log
    assert result.remote_execution["remote_actions"] == 1  # it ran on a worker
    assert result.output("//g:long").read_text() == "released"
    assert live.read("//g:long") is None  # forgotten once the action ended


def test_a_worker_killed_mid_action_is_survived(tmp_path, cache_server, local_cluster):
    markers = tmp_path / "markers"
    markers.mkdir()
    ws = make(tmp_path, "ws")
    ws.write("k/BUILD.toml", f'[slow]\nrule = "block"\nmarkers = "{markers}"\n')
    url = _prefix(cache_server, tmp_path)
    outcome = {}

    def build() -> None:
        outcome["result"] = ws.build("//k:slow", remote_cache=url, strategy=["*=remote"],
                                     remote_executor=_address(local_cluster))

    thread = threading.Thread(target=build)
    thread.start()
    deadline = time.monotonic() + 60
    while not (markers / "started").exists() or not (markers / "started").read_text():
        assert time.monotonic() < deadline and thread.is_alive(), outcome["result"].error
        time.sleep(0.05)
    pid = int((markers / "started").read_text())
    os.kill(pid, signal.SIGKILL)  # the worker process running the action
    thread.join(120)
    result = outcome["result"]
    assert result.ok, result.error + result.log
    assert result.output("//k:slow").read_text() == "done"
    assert result.remote_execution["remote_actions"] == 1
    # Nothing partial on the server: one entry, and every blob it names is there whole.
    from qbuild.store.remote import parse_action_result

    entries = list((cache_server.root / tmp_path.name / "ac").iterdir())
    assert len(entries) == 1
    outputs, meta = parse_action_result(entries[0].read_bytes())
    for entry in outputs:
        blob = cache_server.root / tmp_path.name / "cas" / entry["digest"]
        assert blob.stat().st_size == entry["size"]
    # The action's log travels with the entry, and the client's copy of the entry names
    # it (so qbuild log finds it): issue 26.
    import json

    cas = cache_server.root / tmp_path.name / "cas"
    logged = json.loads((cas / meta[0]).read_text())["log"]
    assert "the retry wrote the output" in (cas / logged["digest"]).read_text()
    store = LocalStore(ws.cache_dir)
    try:
        held = store.get_action(_last_keys(ws)["//k:slow"])
    finally:
        store.close()
    assert held is not None and held.log is not None
    assert held.log.digest == logged["digest"]


def test_unreachable_scheduler_is_one_error_or_a_local_build(tmp_path, cache_server):
    from remote_servers import free_port

    ws = make(tmp_path, "ws")
    url = _prefix(cache_server, tmp_path)
    nowhere = f"dask://127.0.0.1:{free_port()}"
    failed = ws.build("//p:top", remote_cache=url, remote_executor=nowhere, remote_timeout=1)
    assert not failed.ok and failed.exit_code == 2
    assert "cannot reach the Dask scheduler at " + nowhere in failed.error
    assert "--remote_local_fallback" in failed.error
    fallback = ws.build("//p:top", remote_cache=url, remote_executor=nowhere,
                        remote_timeout=1, remote_local_fallback=True, strategy=["*=remote"])
    assert fallback.ok, fallback.error
    assert len(fallback.ran) == 3 and fallback.remote_execution["local_actions"] == 3
    assert "building here" in fallback.log


def test_usage_errors_exit_2(tmp_path):
    ws = make(tmp_path, "ws")
    alone = ws.cli("build", "//p:top", "--remote_executor=dask://127.0.0.1:1")
    assert alone.code == 2 and "--remote_executor needs a remote cache" in alone.stderr
    bad = ws.build("//p:top", remote_cache="http://127.0.0.1:1",
                   remote_executor="http://127.0.0.1:1")
    assert bad.exit_code == 2 and "write dask://host:port" in bad.error
    strategy = ws.build("//p:top", remote_cache="http://127.0.0.1:1",
                        remote_executor="dask://127.0.0.1:1", strategy=["concat=cloud"])
    assert strategy.exit_code == 2 and "KIND=remote or KIND=local" in strategy.error


TOLERANT = """
[a]
rule = "summarize"
srcs = ["a.txt"]

[b]
rule = "summarize"
srcs = ["b.txt"]
fail = true

[best]
rule = "best_of"
texts = [":a", ":b"]
"""


def test_a_tolerated_failure_on_the_cluster(tmp_path, cache_server, local_cluster):
    import toy_rules_v2
    import toy_tolerant

    outcomes = {}
    for name, remote in (("here", False), ("there", True)):
        ws = Workspace(tmp_path / name, tmp_path / f"cache-{name}")
        ws.register(toy_rules_v2)
        ws.register(toy_tolerant)
        ws.write("p/a.txt", "one two")
        ws.write("p/b.txt", "three")
        ws.write("p/BUILD.toml", TOLERANT)
        options = dict(remote_cache=_prefix(cache_server, tmp_path), strategy=["*=remote"],
                       remote_executor=_address(local_cluster)) if remote else {}
        outcomes[name] = ws.build("//p:best", jobs=1, **options)
    here, there = outcomes["here"], outcomes["there"]
    assert there.ok and there.exit_code == 0, there.error + there.log
    assert "asked to fail" in there.tolerated["//p:b"]
    assert there.remote_execution["remote_actions"] >= 2  # //p:a's actions and //p:best
    # the dependent ran on a worker with the failure's stand-in, as it does here
    assert there.output("//p:best").read_bytes() == here.output("//p:best").read_bytes()
    lines = there.output("//p:best").read_text().splitlines()
    assert lines[0] == "ok 2" and lines[1].startswith("failed: ")
