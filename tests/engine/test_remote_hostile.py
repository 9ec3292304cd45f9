"""A hostile remote cache (``FaultServer`` on 127.0.0.1) against the one gate every remote
entry passes: entries served for the wrong key, garbage and truncated JSON, huge claimed
sizes, compression bombs, trickled status lines and error pages, redirects and 5xx
storms. Each is a miss or a retry with at most one warning; none serves a wrong byte,
fails, hangs or crashes a build.

The tests numbered after issue 24's defects use only ``qbuild.testing``, the command line
and the server, so they also run against the code the issue was filed on (05cd88b), where
each of them fails: ``pytest --noconftest tests/engine/test_remote_hostile.py`` with that
checkout first on ``PYTHONPATH``.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import toy_rules
from remote_servers import FaultServer

from qbuild.testing import CliOutcome, Workspace

RESULT_PATH = ".qbuild/result.json"
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
"""
HELLO = '[hello]\nrule = "command"\nouts = ["h.txt"]\ncmd = "echo hello > $(OUT)"\n'
USER = ('[user]\nrule = "command"\nsrcs = [":hello"]\nouts = ["u.txt"]\n'
        'cmd = "cat $(location :hello) $(location :hello) > $(OUT)"\n')
SCRIPT = r"""
[script]
rule = "command"
outs = ["run.sh"]
cmd = "printf '#!/bin/sh\\necho ran\\n' > $(OUT) && chmod +x $(OUT)"
"""
RUNS = """
[{name}]
rule = "command"
srcs = [":script"]
outs = ["{name}.txt"]
cmd = "$(location :script) > $(OUT)"
"""


@pytest.fixture
def fault():
    server = FaultServer()
    yield server
    server.stop()


def toy(tmp_path: Path, name: str) -> Workspace:
    ws = Workspace(tmp_path / name, tmp_path / f"cache-{name}")
    ws.register(toy_rules)
    ws.write("p/a.txt", "alpha\n")
    ws.write("p/b.txt", "beta\n")
    ws.write("p/BUILD.toml", GRAPH)
    return ws


def commands(tmp_path: Path, name: str, build: str = HELLO) -> Workspace:
    ws = Workspace(tmp_path / name, tmp_path / f"cache-{name}")
    ws.write("c/BUILD.toml", build)
    return ws


def warnings(log: str) -> list[str]:
    return [line for line in log.splitlines() if line.startswith("WARNING: remote cache")]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def entry_for(fault: FaultServer, digest: str) -> str:
    """The server path of the action-cache entry listing the output ``digest``."""
    for path, body in fault.blobs.items():
        if path.startswith("/ac/"):
            files = json.loads(body)["outputFiles"]
            if any(f["digest"]["hash"] == digest for f in files):
                return path
    raise AssertionError(f"no entry lists {digest}")


def meta_path(entry: bytes) -> str:
    (meta,) = [f for f in json.loads(entry)["outputFiles"] if f["path"] == RESULT_PATH]
    return f"/cas/{meta['digest']['hash']}"


def cli(ws: Workspace, *args: str, max_file_bytes: int | None = None,
        timeout: float = 240) -> CliOutcome:
    """``ws.cli``, with the size of any file the build writes limited when asked
    (``RLIMIT_FSIZE``: a write past it fails with EFBIG, so "never wrote more than N bytes"
    is a plain outcome, not a measurement)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("QBUILD_CACHE_DIR", "QBUILD_REMOTE_CACHE",
                        "QBUILD_REMOTE_UPLOAD_LOCAL_RESULTS")}

    def limit() -> None:
        if max_file_bytes is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (max_file_bytes, max_file_bytes))

    try:
        proc = subprocess.run([sys.executable, "-m", "qbuild", *args], cwd=ws.root,
                              capture_output=True, text=True, timeout=timeout, env=env,
                              preexec_fn=limit)
    except subprocess.TimeoutExpired:
        pytest.fail(f"qbuild {' '.join(args)} still ran after {timeout} s (a hang)")
    return CliOutcome(proc.returncode, proc.stdout, proc.stderr)


def ends_with_summary(out: CliOutcome) -> bool:
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    return bool(lines) and lines[-1].startswith("Build OK") and \
        "internal error" not in out.stderr + out.stdout


# -- issue 24, defect 1 -----------------------------------------------------------------
def test_1_a_remote_hit_keeps_the_executable_bit(fault, tmp_path):
    build = SCRIPT + RUNS.format(name="use")
    a, b = commands(tmp_path, "a", build), commands(tmp_path, "b", build)
    first = a.build("//c:use", "//c:script", remote_cache=fault.url)
    assert first.ok, first.error
    # The dependent's key holds the script's executable bit: the same here as there.
    second = b.build("//c:use", "//c:script", remote_cache=fault.url)
    assert second.ok, second.error
    assert second.ran == [] and sorted(second.remote_hits) == ["//c:script", "//c:use"]
    assert second.output("//c:script").stat().st_mode & 0o777 == 0o555
    # A dependent that runs here executes the script fetched for it.
    c = commands(tmp_path, "c", SCRIPT + RUNS.format(name="again"))
    third = c.build("//c:again", remote_cache=fault.url)
    assert third.ok, third.error
    assert third.ran == ["//c:again"] and third.remote_hits == ["//c:script"]
    assert third.output("//c:again").read_text() == "ran\n"


# -- defect 2 --------------------------------------------------------------------------------
def test_2_an_entry_served_for_another_key_is_refused_and_not_recorded(fault, tmp_path):
    a, b = toy(tmp_path, "a"), toy(tmp_path, "b")
    good = a.build("//p:top", "//p:two", remote_cache=fault.url)
    assert good.ok, good.error
    one = entry_for(fault, sha(b"alpha\nbeta\n"))
    two = entry_for(fault, sha(good.output("//p:two").read_bytes()))
    fault.blobs[two] = fault.blobs[one]  # a gateway folding two paths into one
    served = b.build("//p:two", remote_cache=fault.url)
    assert served.ok, served.error
    assert served.output("//p:two").read_bytes() == good.output("//p:two").read_bytes()
    assert served.ran == ["//p:two"] and served.remote_hits == ["//p:one"]
    (line,) = warnings(served.log)
    assert "refused" in line and two[4:16] in line
    # Nothing of the wrong entry was kept: without the server, the local result holds.
    local = b.build("//p:two")
    assert local.ok and local.ran == []
    assert local.output("//p:two").read_bytes() == good.output("//p:two").read_bytes()


# -- defect 9 --------------------------------------------------------------------------------
def test_9_a_compression_bomb_stops_at_the_blob_size(fault, tmp_path):
    pytest.importorskip("zstandard", reason="zstd is optional: needs the zstandard package")
    a, b = commands(tmp_path, "a"), commands(tmp_path, "b")
    assert cli(a, "build", "//c:hello", f"--remote_cache={fault.url}").code == 0
    fault.mode = "bomb"  # 64 MiB of zeros in a few KB of zstd, for a 6-byte blob
    out = cli(b, "build", "//c:hello", f"--remote_cache={fault.url}",
              max_file_bytes=8 << 20)
    assert out.code == 0, out.stderr
    assert "File too large" not in out.stderr  # no write went past the blob's size
    (line,) = warnings(out.stderr)
    assert "did not match" in line
    assert b.path("qbuild-out/c/@hello/h.txt").read_text() == "hello\n"
    assert ends_with_summary(out)


def test_9_a_blob_of_an_entry_recorded_earlier_is_bounded_by_its_size(fault, tmp_path):
    a, b = commands(tmp_path, "a", HELLO + USER), commands(tmp_path, "b", HELLO + USER)
    assert cli(a, "build", "//c:user", f"--remote_cache={fault.url}").code == 0
    # Build without the bytes: //c:hello's entry is recorded here, its blob is not.
    hits = cli(b, "build", "//c:user", f"--remote_cache={fault.url}")
    assert hits.code == 0 and not warnings(hits.stderr), hits.stderr
    fault.mode = "oversize"  # 64 MiB of plain bytes for the 6-byte blob
    out = cli(b, "build", "//c:hello", f"--remote_cache={fault.url}",
              max_file_bytes=8 << 20)
    assert out.code == 0, out.stderr
    assert "File too large" not in out.stderr
    assert len(warnings(out.stderr)) == 1
    assert b.path("qbuild-out/c/@hello/h.txt").read_text() == "hello\n"
    assert ends_with_summary(out)


# -- defect 10 -------------------------------------------------------------------------------
def test_10_a_metadata_blob_claiming_a_huge_size_is_not_downloaded(fault, tmp_path):
    a, b = toy(tmp_path, "a"), toy(tmp_path, "b")
    assert a.build("//p:one", remote_cache=fault.url).ok
    path = entry_for(fault, sha(b"alpha\nbeta\n"))
    entry = json.loads(fault.blobs[path])
    for item in entry["outputFiles"]:
        if item["path"] == RESULT_PATH:
            item["digest"]["sizeBytes"] = str(64 << 20)
            meta = f"/cas/{item['digest']['hash']}"
    fault.blobs[path] = json.dumps(entry).encode()
    fault.huge[meta] = 64 << 20  # and the server would send all of it
    result = b.build("//p:one", remote_cache=fault.url)
    assert result.ok, result.error
    assert result.ran == ["//p:one"] and len(warnings(result.log)) == 1
    assert fault.count_path("GET", meta) == 0


# -- defect 11 -------------------------------------------------------------------------------
def test_11_a_header_value_with_a_newline_is_a_usage_error(fault, tmp_path):
    ws = commands(tmp_path, "a")
    toml = ws.path("qbuild.toml")
    toml.write_text(toml.read_text() + f'[remote]\ncache = "{fault.url}"\n'
                    'headers = { X-Token = "abc\\nsecr3t" }\n')
    out = cli(ws, "build", "//c:hello")
    assert out.code == 2, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "X-Token" in out.stderr and "internal error" not in out.stderr
    assert "secr3t" not in out.stderr + out.stdout
    assert fault.requests == []


# -- defect 12 -------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["trickle_error", "trickle_headers"])
def test_12_a_trickling_server_cannot_outlast_the_deadline(fault, tmp_path, mode):
    ws = commands(tmp_path, "a")
    fault.mode, fault.delay = mode, 0.05
    out = cli(ws, "build", "//c:hello", f"--remote_cache={fault.url}", "--remote_timeout=1",
              timeout=60)  # (what a hang is, not a measurement: the build takes seconds)
    assert out.code == 0, out.stderr
    (line,) = warnings(out.stderr)
    assert "remote timeout" in line or "timed out" in line
    assert ws.path("qbuild-out/c/@hello/h.txt").read_text() == "hello\n"
    assert ends_with_summary(out)


# -- defect 13 -------------------------------------------------------------------------------
def _nested(entry: bytes) -> bytes:
    return b'{"outputFiles": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"


def _infinite_size(entry: bytes) -> bytes:
    data = json.loads(entry)
    for item in data["outputFiles"]:
        if item["path"] != RESULT_PATH:
            item["digest"]["sizeBytes"] = "SIZE"
    return json.dumps(data).encode().replace(b'"SIZE"', b"1e999")


def _truncated(entry: bytes) -> bytes:
    return entry[: len(entry) // 2]


@pytest.mark.parametrize("garble", [_nested, _infinite_size, _truncated],
                         ids=["nested", "1e999", "truncated"])
def test_13_a_garbage_entry_is_a_miss_with_one_warning(fault, tmp_path, garble):
    a, b = commands(tmp_path, "a"), commands(tmp_path, "b")
    assert cli(a, "build", "//c:hello", f"--remote_cache={fault.url}").code == 0
    (path,) = [p for p in fault.blobs if p.startswith("/ac/")]
    fault.blobs[path] = garble(fault.blobs[path])
    out = cli(b, "build", "//c:hello", f"--remote_cache={fault.url}")
    assert out.code == 0, out.stderr
    assert len(warnings(out.stderr)) == 1, out.stderr
    assert b.path("qbuild-out/c/@hello/h.txt").read_text() == "hello\n"
    assert ends_with_summary(out), out.stderr


# -- defect 16 -------------------------------------------------------------------------------
def test_16_malformed_key_parts_of_a_remote_entry_are_never_stored(fault, tmp_path):
    a, b = commands(tmp_path, "a"), commands(tmp_path, "b")
    assert cli(a, "build", "//c:hello", f"--remote_cache={fault.url}").code == 0
    (path,) = [p for p in fault.blobs if p.startswith("/ac/")]
    entry = json.loads(fault.blobs[path])
    meta = json.loads(fault.blobs[meta_path(fault.blobs[path])])
    meta["components"]["sources"] = "not a table"
    meta["components"]["deps"] = {"//x:y": "not a table either"}
    raw = json.dumps(meta, sort_keys=True).encode()
    fault.blobs[f"/cas/{sha(raw)}"] = raw
    for item in entry["outputFiles"]:
        if item["path"] == RESULT_PATH:
            item["digest"] = {"hash": sha(raw), "sizeBytes": str(len(raw))}
    fault.blobs[path] = json.dumps(entry).encode()
    out = cli(b, "build", "//c:hello", f"--remote_cache={fault.url}")
    assert out.code == 0 and ends_with_summary(out), out.stderr
    # The target changes, so explain diffs what was recorded for its last key.
    b.write("c/BUILD.toml", HELLO.replace("echo hello", "echo hello again"))
    explained = cli(b, "explain", "//c:hello")
    assert explained.code == 0, explained.stderr
    assert "internal error" not in explained.stderr + explained.stdout
    assert "cmd" in explained.stdout


# -- the rest of the hostile server --------------------------------------------------------
def test_redirects_are_not_followed(fault, tmp_path):
    sink = FaultServer()
    try:
        a, b = toy(tmp_path, "a"), toy(tmp_path, "b")
        assert a.build("//p:top", remote_cache=fault.url).ok
        fault.mode, fault.redirect_to = "redirect", sink.url
        result = b.build("//p:top", remote_cache=fault.url,
                         remote_headers=["X-Token=s3cret"])
        assert result.ok, result.error
        assert sorted(result.ran) == ["//p:one", "//p:top", "//p:two"]
        (line,) = warnings(result.log)
        assert "307" in line and "s3cret" not in result.log
        assert sink.requests == []  # neither the request nor its headers went elsewhere
    finally:
        sink.stop()


def test_a_5xx_storm_is_retried_with_backoff(fault, tmp_path):
    a, b = toy(tmp_path, "a"), toy(tmp_path, "b")
    good = a.build("//p:top", remote_cache=fault.url)
    assert good.ok
    fault.mode, fault.errors_left = "storm", 3
    result = b.build("//p:top", remote_cache=fault.url)
    assert result.ok, result.error
    assert result.ran == [] and not warnings(result.log), result.log
    assert result.output("//p:top").read_bytes() == good.output("//p:top").read_bytes()
    assert fault.errors_left == 0
