"""Incremental builds: what reruns, what does not, and that results stay correct."""

import os
import shutil
import time

CHAIN = """
[a]
rule = "concat"
srcs = ["a.txt"]

[b]
rule = "concat"
srcs = ["b.txt"]

[ab]
rule = "concat"
deps = [":a", ":b"]
sep = "+"

[len]
rule = "length"
dep = ":ab"
"""


def _setup(ws):
    ws.write("p/a.txt", "alpha")
    ws.write("p/b.txt", "beta")
    ws.write("p/BUILD.toml", CHAIN)
    time.sleep(0.1)  # files younger than the filesystem clock's tick are never memoised


def test_second_build_runs_no_action_and_hashes_nothing(ws):
    """A no-op build serves every action from the cache and hashes zero bytes."""
    _setup(ws)
    first = ws.build("//p:len")
    assert first.ok, first.error
    assert first.ran == ["//p:a", "//p:b", "//p:ab", "//p:len"] or sorted(first.ran) == sorted(
        ["//p:a", "//p:b", "//p:ab", "//p:len"])
    assert first.output("//p:len").read_text() == "10"
    second = ws.build("//p:len")
    assert second.ran == []
    assert second.bytes_hashed == 0
    assert second.info("//p:ab") == {"length": 10}


def test_editing_one_source_reruns_only_its_dependents(ws):
    _setup(ws)
    ws.build("//p:len")
    ws.write("p/a.txt", "ALPHA!")
    result = ws.build("//p:len")
    assert sorted(result.ran) == ["//p:a", "//p:ab", "//p:len"]
    assert result.output("//p:len").read_text() == "11"


def test_early_cutoff_stops_at_identical_outputs(ws):
    """A rebuilt target with byte-identical outputs does not rerun its dependents."""
    _setup(ws)
    ws.write("p/BUILD.toml", CHAIN.replace('srcs = ["a.txt"]', 'srcs = ["a.txt"]\nupper = true'))
    ws.build("//p:len")
    ws.write("p/a.txt", "ALPHA")  # upper-cased output is unchanged
    result = ws.build("//p:len")
    assert result.ran == ["//p:a"]


def test_attribute_change_and_removal_rerun(ws):
    _setup(ws)
    ws.build("//p:len")
    ws.write("p/BUILD.toml", CHAIN.replace('sep = "+"', 'sep = "-"'))
    changed = ws.build("//p:len")
    assert changed.ran == ["//p:ab", "//p:len"]
    ws.write("p/BUILD.toml", CHAIN.replace('sep = "+"\n', ""))
    removed = ws.build("//p:len")
    assert removed.ran == ["//p:ab", "//p:len"]
    assert removed.output("//p:len").read_text() == "9"
    ws.write("p/BUILD.toml", CHAIN.replace('sep = "+"', 'sep = ""'))
    assert ws.build("//p:len").ran == []  # writing the default explicitly changes nothing


def test_rule_version_bump_reruns(ws):
    import toy_rules

    _setup(ws)
    ws.build("//p:len")
    old = toy_rules.Length.version
    toy_rules.Length.version = old + 1
    try:
        result = ws.build("//p:len", explain=True)
    finally:
        toy_rules.Length.version = old
    assert result.ran == ["//p:len"]
    assert any("rule: length v1 -> length v2" in line
               for line in result.explanations["//p:len"])


def test_moving_the_workspace_keeps_every_hit(ws, tmp_path):
    from qbuild.testing import Workspace

    _setup(ws)
    assert ws.build("//p:len").ok
    moved_root = tmp_path / "elsewhere" / "ws2"
    shutil.copytree(ws.root, moved_root)
    shutil.rmtree(moved_root / "qbuild-out")
    moved = Workspace.existing(moved_root, plugins=ws.plugins)
    assert moved.cache_dir == ws.cache_dir.resolve()
    result = moved.build("//p:len")
    assert result.ok and result.ran == []
    assert result.output("//p:len").read_text() == "10"


def test_moving_the_cache_keeps_every_hit(ws, tmp_path):
    _setup(ws)
    assert ws.build("//p:len").ok
    new_cache = tmp_path / "moved-cache"
    shutil.move(ws.cache_dir, new_cache)
    ws.write("qbuild.toml", f'[settings]\ncache_dir = "{new_cache.as_posix()}"\n')
    shutil.rmtree(ws.root / "qbuild-out")
    result = ws.build("//p:len")
    assert result.ran == []
    assert result.output("//p:len").read_text() == "10"


def test_same_size_edit_with_restored_mtime_is_detected(ws):
    _setup(ws)
    ws.build("//p:len")
    path = ws.path("p/a.txt")
    st = os.stat(path)
    path.write_text("ALPHA")  # same size
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_mtime_ns == st.st_mtime_ns
    result = ws.build("//p:ab")
    assert "//p:a" in result.ran
    assert result.output("//p:ab").read_text() == "ALPHA+beta"


def test_touched_unchanged_file_is_hashed_once_and_reruns_nothing(ws):
    _setup(ws)
    ws.build("//p:len")
    path = ws.path("p/a.txt")
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    time.sleep(0.1)
    touched = ws.build("//p:len")
    assert touched.ran == []
    assert touched.bytes_hashed == len("alpha")
    assert ws.build("//p:len").bytes_hashed == 0


def test_matrix_variants_share_upstream_targets(ws):
    ws.write("p/a.txt", "x")
    ws.write("p/BUILD.toml", """
        [base]
        rule = "concat"
        srcs = ["a.txt"]

        [grid]
        rule = "concat"
        deps = [":base"]
        sep = "{mode}"
        matrix = { repeat = [1, 2], mode = ["plain", "fancy"] }

        [pick]
        rule = "length"
        dep = ":grid@repeat=2,mode=fancy"
    """)
    result = ws.build("//p:grid")
    assert result.ok, result.error
    assert sorted(result.ran) == sorted(["//p:base", "//p:grid@repeat=1,mode=plain",
                                         "//p:grid@repeat=1,mode=fancy",
                                         "//p:grid@repeat=2,mode=plain",
                                         "//p:grid@repeat=2,mode=fancy"])
    assert ws.build("//p:pick").ran == ["//p:pick"]
    out = ws.path("qbuild-out/p/@grid@repeat=2,mode=fancy/out.txt")
    assert out.read_text() == "xx"


def test_heavy_actions_run_in_worker_processes(ws):
    ws.write("p/a.txt", "abc")
    ws.write("p/BUILD.toml", """
        [h1]
        rule = "heavy_concat"
        srcs = ["a.txt"]
        repeat = 2

        [h2]
        rule = "heavy_concat"
        srcs = ["a.txt"]
        upper = true
    """)
    result = ws.build("//p:all", jobs=2)
    assert result.ok, result.error
    assert ws.path("qbuild-out/p/@h1/out.txt").read_text() == "abcabc"
    assert ws.path("qbuild-out/p/@h2/out.txt").read_text() == "ABC"


def test_directory_outputs_are_stored_and_restored(ws):
    ws.write("p/BUILD.toml", """
        [t]
        rule = "tree"
        n = 3
    """)
    first = ws.build("//p:t")
    assert first.ok, first.error
    shutil.rmtree(ws.root / "qbuild-out")
    second = ws.build("//p:t")
    assert second.ran == []
    assert sorted(p.name for p in (ws.root / "qbuild-out/p/@t/data").iterdir()) == [
        "f0.txt", "f1.txt", "f2.txt"]


def test_outputs_are_read_only(ws):
    _setup(ws)
    result = ws.build("//p:ab")
    mode = os.stat(result.output("//p:ab")).st_mode
    assert mode & 0o222 == 0


def test_matrix_keys_the_rule_lacks_are_template_variables_and_groups_expand(ws):
    ws.write("p/a.txt", "x")
    ws.write("p/BUILD.toml", """
        [base]
        rule = "concat"
        srcs = ["a.txt"]
        matrix = { repeat = [1, 3] }

        [paired]
        rule = "concat"
        deps = [":base@repeat={k}"]
        sep = "{k}"
        matrix = { k = [1, 3] }

        [everything]
        rule = "concat"
        deps = [":base"]
        sep = ","

        [single]
        rule = "length"
        dep = ":base"
    """)
    result = ws.build("//p:paired", "//p:everything")
    assert result.ok, result.error
    assert ws.path("qbuild-out/p/@paired@k=3/out.txt").read_text() == "xxx"
    assert ws.path("qbuild-out/p/@everything/out.txt").read_text() == "x,xxx"
    single = ws.build("//p:single")
    assert single.exit_code == 2
    assert "//p:base is a matrix of 2 variants; name one" in single.error
