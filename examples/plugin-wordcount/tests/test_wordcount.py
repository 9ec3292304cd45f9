"""Tests of the example plugin, written with qbuild.testing like any plugin's."""

import qbuild_wordcount


def test_counts_words_and_caches(qbuild_workspace):
    ws = qbuild_workspace
    ws.register(qbuild_wordcount)  # not needed once the plugin is pip-installed
    ws.write("docs/a.txt", "one two three")
    ws.write("docs/BUILD.toml", """
        [words]
        rule = "word_count"
        srcs = ["*.txt"]
        min_length = 4
    """)
    first = ws.build("//docs:words")
    assert first.ok, first.error
    assert first.output("//docs:words").read_text() == "1\n"
    assert first.info("//docs:words") == {"words": 1}
    assert ws.build("//docs:words").ran == []
