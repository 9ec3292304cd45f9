"""A dependency declared ``tolerate_failures``: its failure fails neither its dependent nor
the build (unless the user asked for it), the dependent sees why, and nothing made
without it outlives the failure (a failure is never cached; the reason is in the key)."""

from __future__ import annotations

import pytest
import toy_rules_v2
import toy_tolerant

BUILD = """
[a]
rule = "summarize"
srcs = ["a.txt"]

[b]
rule = "summarize"
srcs = ["b.txt"]
fail = {fail_b}

[c]
rule = "summarize"
srcs = ["c.txt"]
fail = {fail_c}

[after_b]
rule = "consume"
texts = [":b"]

[best]
rule = "best_of"
texts = [":a", ":b", ":c"]
"""


@pytest.fixture
def tws(ws):
    ws.register(toy_rules_v2)
    ws.register(toy_tolerant)
    for name, text in (("a", "one two"), ("b", "three"), ("c", "four five six")):
        ws.write(f"p/{name}.txt", text)
    return ws


def _best(r) -> list[str]:
    return r.output("//p:best").read_text().splitlines()


def test_a_failed_candidate_is_listed_and_the_build_succeeds(tws):
    tws.write("p/BUILD.toml", BUILD.format(fail_b="true", fail_c="false"))
    r = tws.build("//p:best", jobs=1)  # jobs=1: the failure comes before c in the plan
    assert r.ok and r.exit_code == 0, r.error
    assert not r.failed and not r.skipped
    assert "asked to fail" in r.tolerated["//p:b"]
    lines = _best(r)
    assert lines[0] == "ok 2" and lines[2] == "ok 3"
    assert lines[1].startswith("failed: ") and "asked to fail" in lines[1]
    assert "//p:c" in r.ran  # the build did not stop at the failure
    assert "tolerated" in r.log

    # never cached as a success: the next build tries b again; with the same failure the
    # dependent's result (made from that very reason) is reused
    again = tws.build("//p:best")
    assert again.ok and "//p:b" in again.tolerated and "//p:best" in again.cached
    assert again.ran == []

    # b fixed: b builds and the dependent runs again (its key held b's failure)
    tws.write("p/BUILD.toml", BUILD.format(fail_b="false", fail_c="false"))
    fixed = tws.build("//p:best")
    assert fixed.ok and not fixed.tolerated
    assert sorted(fixed.ran) == ["//p:b", "//p:best"]
    assert _best(fixed) == ["ok 2", "ok 1", "ok 3"]


def test_what_the_user_asks_for_or_needs_without_tolerance_still_fails(tws):
    tws.write("p/BUILD.toml", BUILD.format(fail_b="true", fail_c="false"))
    r = tws.build("//p:best", "//p:b")  # asked for: its failure is the build's
    assert not r.ok and "//p:b" in r.failed
    r = tws.build("//p:best", "//p:after_b", keep_going=True)  # needed by after_b
    assert not r.ok and "//p:b" in r.failed and r.skipped == ["//p:after_b"]
    assert "//p:best" in r.cached + r.ran  # the tolerant one still built


def test_every_candidate_failing_is_the_dependents_failure(tws):
    tws.write("p/BUILD.toml", BUILD.format(fail_b="true", fail_c="true").replace(
        'srcs = ["a.txt"]', 'srcs = ["a.txt"]\nfail = true'))
    r = tws.build("//p:best")
    assert not r.ok and "every candidate failed" in r.failed["//p:best"]
    assert set(r.tolerated) == {"//p:a", "//p:b", "//p:c"}


def test_a_tolerated_failure_leaves_no_shortcut_for_the_next_build(tws):
    """Neither the no-op fast path nor the incremental path may answer the next build
    from this one: that would skip trying the failed dependency again."""
    from qbuild.build.progress import ConsoleReporter
    from qbuild.build.run import BuildOptions
    from qbuild.build.session import Session

    tws.write("p/BUILD.toml", BUILD.format(fail_b="true", fail_c="false"))
    session, package = Session.open(tws.root, plugins=tws.plugins, environ={},
                                    entry_point_cache=False)
    try:
        import io

        build = session.build(["//p:best"], package, BuildOptions(jobs=1),
                              ConsoleReporter(io.StringIO(), tty=False))
        assert build.result.ok and "//p:b" in build.result.tolerated
        assert build.reads() is None and build.reusable() == {}
    finally:
        session.close()
