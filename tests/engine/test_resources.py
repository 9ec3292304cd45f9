"""Resources: rules declare the cores and memory one action needs; the scheduler keeps
running actions within --local_resources and tells each action its thread count."""

import textwrap


def _spans(result, labels):
    out = []
    for label in labels:
        threads, start, end = result.output(label).read_text().split()
        out.append((int(threads), float(start), float(end)))
    return out


def _overlaps(spans):
    ordered = sorted(spans, key=lambda s: s[1])
    return any(b[1] < a[2] for a, b in zip(ordered, ordered[1:]))


def test_actions_needing_all_cores_run_one_at_a_time(ws):
    ws.write("p/BUILD.toml", textwrap.dedent("""
        [a]
        rule = "span"
        cores = 2

        [b]
        rule = "span"
        cores = 2

        [c]
        rule = "span"
        cores = 5
    """))
    labels = ["//p:a", "//p:b", "//p:c"]
    result = ws.build(*labels, jobs=3, cpu=2)
    assert result.ok, result.error
    spans = _spans(result, labels)
    assert [s[0] for s in spans] == [2, 2, 2]  # granted min(need, budget)
    assert not _overlaps(spans)


def test_memory_needs_are_respected(ws):
    ws.write("p/BUILD.toml", textwrap.dedent("""
        [a]
        rule = "span"
        mib = 600

        [b]
        rule = "span"
        mib = 600
    """))
    result = ws.build("//p:a", "//p:b", jobs=2, cpu=4, memory=1000)
    assert result.ok, result.error
    assert not _overlaps(_spans(result, ["//p:a", "//p:b"]))


def test_local_resources_on_the_command_line(ws):
    ws.write("p/BUILD.toml", '[a]\nrule = "span"\ncores = 8\n')
    bad = ws.cli("build", "//p:a", "--local_resources", "gpu=1")
    assert bad.code == 2 and "bad --local_resources 'gpu=1'" in bad.stderr


def test_onnxruntime_rules_default_to_one_core():
    from qbuild_onnx.rules.source import Calibrate

    assert Calibrate().resources({"threads": 3})[0] == 3
