"""Tests of the v2 example plugin, written with qbuild.testing like any plugin's."""

import qbuild_textstats
from qbuild_textstats import TextStatsInfo

BUILD = """
[stats]
rule = "text_stats"
srcs = ["*.txt"]
min_length = 4
title = "{title}"

[other]
rule = "text_stats"
srcs = ["b.txt"]

[ranking]
rule = "text_ranking"
texts = [":stats", ":other"]
"""


def _workspace(ws, title="Statistics"):
    ws.register(qbuild_textstats)  # not needed once the plugin is pip-installed
    ws.write("docs/a.txt", "one two three")
    ws.write("docs/b.txt", "alpha beta gamma delta")
    ws.write("docs/BUILD.toml", BUILD.format(title=title))
    return ws


def test_counts_reports_and_gives_a_typed_provider(qbuild_workspace):
    ws = _workspace(qbuild_workspace)
    result = ws.build("//docs:stats")
    assert result.ok, result.error
    info = result.provider("//docs:stats", TextStatsInfo)
    assert (info.words, info.longest) == (5, "three")
    assert info.stats == result.outputs("//docs:stats")[0]
    assert result.outputs("//docs:stats")[1].read_text() == (
        "# Statistics\n\n5 words; longest: three\n")
    assert ws.build("//docs:stats").ran == []


def test_changing_the_title_reruns_only_the_report(qbuild_workspace):
    ws = _workspace(qbuild_workspace)
    assert ws.build("//docs:stats").ok
    _workspace(ws, title="Words")
    result = ws.build("//docs:stats")
    assert result.ok, result.error
    assert result.steps["//docs:stats"] == {"Count": "cached", "Report": "ran"}
    assert result.outputs("//docs:stats")[1].read_text().startswith("# Words\n")


def test_ranking_reads_providers_of_its_dependencies(qbuild_workspace):
    ws = _workspace(qbuild_workspace)
    result = ws.build("//docs:ranking")
    assert result.ok, result.error
    assert result.output("//docs:ranking").read_text() == (
        "stats 5 three\nother 4 alpha\n")


def test_a_target_without_the_provider_is_refused_at_analysis(qbuild_workspace):
    ws = _workspace(qbuild_workspace)
    ws.write("docs/BUILD.toml", BUILD.format(title="t") + """
[files]
rule = "filegroup"
srcs = ["a.txt"]

[bad]
rule = "text_ranking"
texts = [":stats", ":files"]
""")
    result = ws.build("//docs:stats", "//docs:bad")
    assert result.exit_code == 2
    assert result.ran == []  # nothing ran, not even the valid target
    assert result.error == (
        "docs/BUILD.toml, target //docs:bad, attribute 'texts': //docs:files (rule "
        "'filegroup') does not provide TextStatsInfo (it provides: DefaultInfo)")
