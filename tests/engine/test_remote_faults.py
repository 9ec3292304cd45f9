"""A misbehaving remote cache never serves anything wrong and never fails a build: errors,
cut-short bodies, wrong bytes under a digest, garbage entries, slow answers, reset and
refused connections each give one warning, and the build goes on locally."""

from __future__ import annotations

import hashlib
import http.client
import json
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
import toy_rules
from remote_servers import FaultServer, Nginx, Wsgidav, free_port, nginx_binary
from test_remote_cache import GRAPH, make

from qbuild import ActionContext, Rule, attr, hookimpl
from qbuild.store.local import LocalStore

ALL = ["//p:one", "//p:top", "//p:two"]


@pytest.fixture
def fault():
    server = FaultServer()
    yield server
    server.stop()


def assert_cache_is_clean(ws) -> None:
    """Every blob in a local cache hashes to its digest."""
    store = LocalStore(ws.cache_dir)
    try:
        for digest in store.blob_digests():
            path = store._blob_path(digest)
            assert hashlib.sha256(path.read_bytes()).hexdigest() == digest
    finally:
        store.close()


def warnings(log: str) -> list[str]:
    return [line for line in log.splitlines() if line.startswith("WARNING: remote cache")]


@pytest.mark.parametrize("mode", ["error", "truncate", "wrong_bytes", "garbage_ac", "slow",
                                  "trickle", "reset"])
def test_a_misbehaving_server_gives_one_warning_and_the_build_runs_locally(fault, tmp_path,
                                                                           mode):
    a, b = make(tmp_path, "a"), make(tmp_path, "b")
    good = a.build("//p:top", "//p:side", remote_cache=fault.url)
    assert good.ok and good.remote["results_uploaded"] == 4
    fault.mode, fault.delay = mode, (0.1 if mode == "trickle" else 2.0)
    result = b.build("//p:top", "//p:side", remote_cache=fault.url, remote_timeout=0.5)
    assert result.ok, result.error
    assert sorted(result.ran) == sorted([*ALL, "//p:side"])
    assert result.remote_hits == []
    assert len(warnings(result.log)) == 1, result.log
    assert "password" not in result.log
    for label in ("//p:top", "//p:side"):
        assert result.output(label).read_bytes() == good.output(label).read_bytes()
    assert_cache_is_clean(b)


def test_a_bad_output_blob_after_a_hit_is_rebuilt_not_served(fault, tmp_path):
    """The entries are fine but the requested output's bytes are not: the target (and
    what it needs) runs here."""
    a, b = make(tmp_path, "a"), make(tmp_path, "b")
    good = a.build("//p:top", remote_cache=fault.url)
    top = hashlib.sha256(good.output("//p:top").read_bytes()).hexdigest()
    blob = fault.blobs[f"/cas/{top}"]
    fault.blobs[f"/cas/{top}"] = bytes(reversed(blob))  # same size, other bytes
    result = b.build("//p:top", remote_cache=fault.url)
    assert result.ok, result.error
    assert sorted(result.remote_hits) == sorted(ALL)  # the entries themselves were usable
    assert len(warnings(result.log)) == 1 and "restored //p:top" in result.log
    assert result.output("//p:top").read_bytes() == good.output("//p:top").read_bytes()
    assert_cache_is_clean(b)
    # This machine made the right bytes again and replaced the server's wrong ones.
    assert result.remote["blobs_repaired"] == 1
    assert fault.blobs[f"/cas/{top}"] == blob
    third = make(tmp_path, "c").build("//p:top", remote_cache=fault.url)
    assert third.ran == [] and not warnings(third.log)


def test_refused_connections_give_one_warning(tmp_path):
    a = make(tmp_path, "a")
    result = a.build("//p:top", remote_cache=f"http://127.0.0.1:{free_port()}")
    assert result.ok and sorted(result.ran) == ALL
    (line,) = warnings(result.log)
    assert "connection refused" in line


def test_uploads_put_every_blob_before_the_entry_that_references_it(fault, tmp_path):
    a = make(tmp_path, "a")
    assert a.build("//p:top", remote_cache=fault.url, jobs=4).ok
    have: set[str] = set()
    for method, path, _ in fault.requests:
        kind, _, digest = path.strip("/").partition("/")
        if method == "PUT" and kind == "cas":
            have.add(digest)
        elif method == "HEAD" and kind == "cas" and f"/cas/{digest}" in fault.blobs:
            have.add(digest)
        elif method == "PUT" and kind == "ac":
            entry = json.loads(fault.blobs[path])
            assert {f["digest"]["hash"] for f in entry["outputFiles"]} <= have
    assert fault.count("PUT", "ac") == 3
    for method, _path, headers in fault.requests:
        if method == "PUT":
            assert "Content-Length" in headers


def test_full_path_local_hits_and_the_noop_fast_path_touch_no_network(fault, tmp_path):
    a = make(tmp_path, "a")
    assert a.build("//p:top", remote_cache=fault.url).ok
    before = len(fault.requests)
    again = a.build("//p:top", remote_cache=fault.url)
    assert sorted(again.cached) == ALL and len(fault.requests) == before

    ws = make(tmp_path, "cli")
    ws.write("c/BUILD.toml", '[hello]\nrule = "command"\nouts = ["h.txt"]\n'
             'cmd = "echo hello > $(OUT)"\n')
    first = ws.cli("build", "//c:hello", f"--remote_cache={fault.url}")
    assert first.code == 0, first.stderr
    before = len(fault.requests)
    noop = ws.cli("build", "//c:hello", f"--remote_cache={fault.url}")
    assert noop.code == 0 and "nothing changed" in noop.stderr
    assert len(fault.requests) == before


def test_zstd_downloads_are_decoded_and_verified(fault, tmp_path):
    pytest.importorskip("zstandard", reason="zstd is optional: needs the zstandard package")
    a, b = make(tmp_path, "a"), make(tmp_path, "b")
    good = a.build("//p:top", remote_cache=fault.url)
    fault.mode = "zstd"
    result = b.build("//p:top", remote_cache=fault.url)
    assert result.ok and result.ran == [] and not warnings(result.log)
    assert result.output("//p:top").read_bytes() == good.output("//p:top").read_bytes()
    gets = [h for m, p, h in fault.requests if m == "GET" and "/cas/" in p]
    assert gets and all("zstd" in h.get("Accept-Encoding", "") for h in gets)


def test_credentials_are_sent_but_never_printed_or_logged(fault, tmp_path):
    ws = make(tmp_path, "cli")
    ws.write("c/BUILD.toml", '[hello]\nrule = "command"\nouts = ["h.txt"]\n'
             'cmd = "echo hello > $(OUT)"\n')
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login ci-user password n3trc-s3cret\n")
    netrc.chmod(0o600)
    env = {"NETRC": str(netrc)}
    events = tmp_path / "events.jsonl"
    ok = ws.cli("build", "//c:hello", f"--remote_cache={fault.url}", "--verbose",
                "--remote_header=X-Cache-Token=h3ader-s3cret", f"--event_log={events}",
                env=env)
    assert ok.code == 0, ok.stderr
    sent = [h for _, _, h in fault.requests]
    assert sent and all(h.get("X-Cache-Token") == "h3ader-s3cret" for h in sent)
    assert all(h.get("Authorization", "").startswith("Basic ") for h in sent)
    fault.mode = "error"
    shutil.rmtree(ws.cache_dir)
    # (500s are retried until the remote timeout: a short one, not the default minute)
    failing = ws.cli("build", "//c:hello", f"--remote_cache={fault.url}", "--verbose",
                     "--remote_timeout=0.5", "--remote_header=X-Cache-Token=h3ader-s3cret",
                     f"--event_log={events}", env=env)
    assert failing.code == 0 and "WARNING: remote cache" in failing.stderr
    bad_flag = ws.cli("build", "//c:hello", "--remote_cache=" + fault.url,
                      "--remote_header=h3ader-s3cret")
    assert bad_flag.code == 2
    texts = [ok.stdout, ok.stderr, failing.stdout, failing.stderr, bad_flag.stderr,
             events.read_text()]
    texts += [p.read_text(errors="replace") for p in ws.path("qbuild-out").rglob("*")
              if p.is_file()]
    for text in texts:
        assert "s3cret" not in text and "ci-user" not in text


def test_tls_is_verified(tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed (needed to make a test certificate)")
    import ssl

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                    str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True,
                   capture_output=True)
    server = FaultServer()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.httpd.socket = context.wrap_socket(server.httpd.socket, server_side=True)
    url = server.url.replace("http://", "https://")
    try:
        ws = make(tmp_path, "a")
        ws.write("c/BUILD.toml", '[hello]\nrule = "command"\nouts = ["h.txt"]\n'
                 'cmd = "echo hello > $(OUT)"\n')
        untrusted = ws.cli("build", "//c:hello", f"--remote_cache={url}")
        assert untrusted.code == 0
        assert "TLS certificate not trusted" in untrusted.stderr
        assert server.count("PUT") == 0
        shutil.rmtree(ws.cache_dir)
        trusted = ws.cli("build", "//c:hello", f"--remote_cache={url}",
                         env={"SSL_CERT_FILE": str(cert)})
        assert trusted.code == 0 and "WARNING" not in trusted.stderr
        assert server.count("PUT", "ac") == 1
    finally:
        server.stop()


def _truncated_put(url: str, path: str, body: bytes) -> None:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(f"PUT {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {len(body)}"
                     "\r\n\r\n".encode() + body[: len(body) // 2])


@pytest.mark.parametrize("kind", ["wsgidav", "nginx"])
def test_an_interrupted_upload_never_serves_a_partial_blob(tmp_path, kind):
    if kind == "nginx":
        if nginx_binary() is None:
            pytest.skip("nginx is not installed")
        server = Nginx(tmp_path / "root")
    else:
        server = Wsgidav(tmp_path / "root")
    try:
        a, b = make(tmp_path, "a"), make(tmp_path, "b")
        good = a.build("//p:top", remote_cache=server.url)
        top = hashlib.sha256(good.output("//p:top").read_bytes()).hexdigest()
        (server.root / "cas" / top).unlink()
        _truncated_put(server.url, f"/cas/{top}", good.output("//p:top").read_bytes() * 100)
        conn = http.client.HTTPConnection(server.url.removeprefix("http://"))
        conn.request("GET", f"/cas/{top}")
        response = conn.getresponse()
        response.read()
        conn.close()
        result = b.build("//p:top", remote_cache=server.url)
        assert result.ok
        assert result.output("//p:top").read_bytes() == good.output("//p:top").read_bytes()
        if kind == "nginx":  # the body went to a temp file and was never published
            assert response.status == 404
        # wsgidav publishes what it got; the entry's size check (and, were the size
        # right, the digest check) keeps it from being served.
        assert result.ran == ["//p:top"]
        assert_cache_is_clean(b)
        # The next upload of a good result repairs it (HEAD sees the wrong size).
        again = make(tmp_path, "c").build("//p:top", remote_cache=server.url)
        assert again.ok
        assert (server.root / "cas" / top).read_bytes() == good.output("//p:top").read_bytes()
    finally:
        server.stop()


def test_bad_settings_are_one_line_usage_errors(tmp_path):
    ws = make(tmp_path, "a")
    ws.write("c/BUILD.toml", '[hello]\nrule = "command"\nouts = ["h.txt"]\n'
             'cmd = "echo hello > $(OUT)"\n')
    bad_url = ws.cli("build", "//c:hello", "--remote_cache=ftp://example.org")
    assert bad_url.code == 2 and bad_url.stderr.count("\n") == 1
    assert "remote cache URL" in bad_url.stderr
    text = ws.path("qbuild.toml").read_text()
    ws.write("qbuild.toml", text + '\n[remote]\ncache = "http://127.0.0.1:1"\nbogus = 1\n')
    bad_key = ws.cli("build", "//c:hello")
    assert bad_key.code == 2 and "qbuild.toml" in bad_key.stderr and "bogus" in bad_key.stderr
    assert GRAPH and toy_rules  # shared with test_remote_cache


def test_an_unreproducible_remote_result_heals_after_one_build(fault, tmp_path):
    """The remote's entry for //p:one names bytes nobody can download (same size, wrong
    content) and this machine's run gives other bytes: that build fails with a clear
    message and keeps the local result, so the next one succeeds with correct outputs."""
    a, b = make(tmp_path, "a"), make(tmp_path, "b")
    good = a.build("//p:two", remote_cache=fault.url)
    (one_key,) = [p for p, body in fault.blobs.items() if p.startswith("/ac/")
                  and b'"out.txt"' in body and hashlib.sha256(b"alpha\nbeta\n").hexdigest()
                  .encode() in body]
    fake = b"ALPHA\nbeta\n"
    fake_digest = hashlib.sha256(fake).hexdigest()
    real_digest = hashlib.sha256(b"alpha\nbeta\n").hexdigest()
    fault.blobs[one_key] = fault.blobs[one_key].replace(real_digest.encode(),
                                                        fake_digest.encode())
    fault.blobs[f"/cas/{fake_digest}"] = b"x" * len(fake)  # present, but not those bytes
    b.write("p/BUILD.toml", GRAPH.replace("upper = true", "upper = true\nrepeat = 3"))
    first = b.build("//p:two", remote_cache=fault.url)
    assert not first.ok and "not deterministic across machines" in first.error
    assert len(warnings(first.log)) == 1
    second = b.build("//p:two", remote_cache=fault.url)
    assert second.ok, second.error
    assert second.output("//p:two").read_text() == "ALPHA\nBETA\n" * 3
    assert good.ok
    assert_cache_is_clean(b)


def test_a_url_prefix_namespaces_the_cache(fault, tmp_path):
    a, b = make(tmp_path, "a"), make(tmp_path, "b")
    assert a.build("//p:top", remote_cache=fault.url + "/team-a/").ok
    assert fault.requests and all(p.startswith("/team-a/") for _, p, _ in fault.requests)
    assert b.build("//p:top", remote_cache=fault.url + "/team-b").ran == [
        "//p:one", "//p:two", "//p:top"]


def test_an_entry_escaping_the_output_folder_is_refused(fault, tmp_path):
    a, b = make(tmp_path, "a"), make(tmp_path, "b")
    assert a.build("//p:top", remote_cache=fault.url).ok
    for path, body in list(fault.blobs.items()):
        if path.startswith("/ac/"):
            fault.blobs[path] = body.replace(b'"path": "out.txt"', b'"path": "../../evil.txt"')
    result = b.build("//p:top", remote_cache=fault.url)
    assert result.ok and sorted(result.ran) == ALL and len(warnings(result.log)) == 1
    assert not list(tmp_path.rglob("evil.txt"))


def test_upload_flag_spellings(fault, tmp_path):
    ws = make(tmp_path, "a")
    ws.write("c/BUILD.toml", '[hello]\nrule = "command"\nouts = ["h.txt"]\n'
             'cmd = "echo hello > $(OUT)"\n')
    url = f"--remote_cache={fault.url}"
    read_only = ws.cli("build", url, "--remote_upload_local_results=false", "//c:hello")
    assert read_only.code == 0 and fault.count("PUT") == 0
    shutil.rmtree(ws.cache_dir)
    writing = ws.cli("build", "--remote_upload_local_results", "//c:hello", url)
    assert writing.code == 0 and fault.count("PUT", "ac") == 1
    bad = ws.cli("build", url, "--remote_upload_local_results=maybe", "//c:hello")
    assert bad.code == 2 and "true or false" in bad.stderr


class WaitForUpload(Rule):
    """Waits (at most 30 s) until the file ``marker`` exists, then writes its output."""

    kind = "wait_for_upload"
    attrs = {"marker": attr.string(required=True, doc="A file to wait for."),
             "deps": attr.label_list(doc="Targets to run after.")}
    outputs = ["out.txt"]

    def run(self, ctx: ActionContext) -> dict:
        deadline = time.monotonic() + 30
        while not Path(ctx.attrs["marker"]).exists():
            if time.monotonic() > deadline:
                raise ctx.fail("no upload reached the server while this action ran",
                               attr="marker")
            time.sleep(0.02)
        ctx.output("out.txt").write_text("seen\n")
        return {}


class _WaitPlugin:
    @hookimpl
    def qbuild_rule_types(self) -> list:
        return [WaitForUpload]


def test_uploads_run_while_the_build_goes_on(fault, tmp_path):
    """The dependent action only finishes once its dependency's entry is on the server:
    an upload deferred to the end of the build would make it fail."""
    marker = tmp_path / "uploaded"
    fault.on_put = lambda path: path.startswith("/ac/") and marker.touch()
    ws = make(tmp_path, "a")
    ws.register(_WaitPlugin())
    ws.write("w/BUILD.toml", f'[wait]\nrule = "wait_for_upload"\nmarker = "{marker}"\n'
             'deps = ["//p:one"]\n')
    result = ws.build("//w:wait", remote_cache=fault.url)
    assert result.ok, result.error
    assert result.remote["results_uploaded"] == 2
