"""The cache is immutable from outside and qbuild touches only what it owns: inputs are
private read-only copies, outputs in qbuild-out are private copies with their modes,
globs never see qbuild's own folders, and symlinks never lead qbuild out of them."""

import os
import textwrap

from test_failures import _blob_holding


def _folder(label):
    try:
        from qbuild import output_folder
    except ImportError:  # before output folders had one public function
        return label[2:].replace(":", "/")
    return output_folder(label)


def test_a_rule_writing_to_a_dependency_input_cannot_touch_the_cache(ws):
    ws.write("p/a.txt", "alpha")
    ws.write("p/BUILD.toml", textwrap.dedent("""
        [a]
        rule = "concat"
        srcs = ["a.txt"]

        [v]
        rule = "vandal"
        deps = [":a"]

        [reader]
        rule = "concat"
        deps = [":a"]
    """))
    result = ws.build("//p:v", "//p:reader", jobs=1, keep_going=True)
    assert "modified its input qbuild-out/p/@a/out.txt" in result.failed["//p:v"]
    assert _blob_holding(ws.cache_dir, "alpha")
    assert result.output("//p:reader").read_text() == "alpha"
    assert ws.build("//p:reader").output("//p:reader").read_text() == "alpha"


def test_a_rule_writing_to_a_source_input_cannot_touch_the_users_file(ws):
    ws.write("p/a.txt", "alpha")
    ws.write("p/BUILD.toml", '[v]\nrule = "vandal"\nsrcs = ["a.txt"]\n')
    result = ws.build("//p:v")
    assert ws.path("p/a.txt").read_text() == "alpha"
    assert "modified its input p/a.txt" in result.failed["//p:v"]


def test_sources_are_staged_as_read_only_copies(ws):
    ws.write("p/a.txt", "alpha")
    ws.write("p/BUILD.toml", '[t]\nrule = "command"\nsrcs = ["a.txt"]\n'
             'cmd = "test ! -L p/a.txt && test ! -w p/a.txt -o $(id -u) = 0 && '
             'stat -c %a p/a.txt > $(OUT)"\nouts = ["o"]\n')
    result = ws.build("//p:t")
    assert result.ok, result.error
    assert result.output("//p:t").read_text().strip() == "444"


def test_a_root_deep_glob_never_sees_the_output_or_cache_folder(qbuild_workspace):
    ws = qbuild_workspace
    import toy_rules

    ws.register(toy_rules)
    ws.write("qbuild.toml", '[settings]\ncache_dir = ".cache"\n')
    ws.write("a.txt", "a")
    ws.write("BUILD.toml", '[all]\nrule = "concat"\nsrcs = ["**/*.txt"]\n')
    first = ws.build("//:all")
    assert first.ok, first.error
    assert first.output("//:all").read_text() == "a"
    assert any(ws.path(".cache").rglob("*"))
    second = ws.build("//:all")
    assert second.ran == []
    assert second.output("//:all").read_text() == "a"


def test_executable_outputs_stay_executable(ws):
    ws.write("p/BUILD.toml", textwrap.dedent("""
        [gen]
        rule = "command"
        cmd = "printf '#!/bin/sh\\\\necho ran\\\\n' > $(OUT) && chmod +x $(OUT)"
        outs = ["tool.sh"]

        [use]
        rule = "command"
        srcs = [":gen"]
        cmd = "./$(location :gen) > $(OUT)"
        outs = ["o"]
    """))
    result = ws.build("//p:gen", "//p:use")
    assert result.ok, result.error
    assert result.output("//p:use").read_text() == "ran\n"
    tool = result.output("//p:gen")
    assert os.access(tool, os.X_OK)
    assert oct(os.stat(tool).st_mode & 0o777) == "0o555"


def test_a_symlink_in_qbuild_out_is_never_followed(ws, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    ws.write("p/a.txt", "alpha")
    ws.write("p/BUILD.toml", '[a]\nrule = "concat"\nsrcs = ["a.txt"]\n')
    assert ws.build("//p:a").ok
    folder = ws.path("qbuild-out/" + _folder("//p:a"))
    for path in sorted(folder.rglob("*"), reverse=True):
        path.unlink()
    folder.rmdir()
    folder.symlink_to(outside)
    result = ws.build("//p:a")
    assert result.ok, result.error
    assert sorted(p.name for p in outside.iterdir()) == ["keep.txt"]
    assert not folder.is_symlink()
    assert result.output("//p:a").read_text() == "alpha"
    # A failed target's folder is removed: the link itself, never what it points to.
    ws.write("p/BUILD.toml", '[a]\nrule = "fail"\n')
    folder_link = folder
    for path in sorted(folder.rglob("*"), reverse=True):
        path.unlink()
    folder.rmdir()
    folder_link.symlink_to(outside)
    assert not ws.build("//p:a").ok
    assert sorted(p.name for p in outside.iterdir()) == ["keep.txt"]


def test_output_and_cache_folders_qbuild_does_not_own_are_refused(ws, tmp_path):
    ws.write("p/a.txt", "alpha")
    ws.write("p/BUILD.toml", '[a]\nrule = "concat"\nsrcs = ["a.txt"]\n')
    cache = ws.cache_dir.as_posix()
    for settings, words in [
        ('output_dir = "."', "workspace root"),
        ('output_dir = "p"', "was not made by qbuild"),
        (f'output_dir = "qbuild-out"\ncache_dir = "{ws.root.as_posix()}"', "holds the workspace"),
        ('cache_dir = "p"', "not a qbuild cache"),
    ]:
        if "cache_dir" not in settings:
            settings += f'\ncache_dir = "{cache}"'
        ws.write("qbuild.toml", f"[settings]\n{settings}\n")
        result = ws.build("//p:a")
        assert result.exit_code == 2 and words in result.error, (settings, result.error)
        assert "qbuild.toml" in result.error
        cli = ws.cli("clean", "--expunge")
        assert cli.code == 2 and words in cli.stderr, (settings, cli.stderr)
        assert ws.path("p/a.txt").read_text() == "alpha"
        assert ws.path("qbuild.toml").exists()


def test_clean_expunge_deletes_only_what_the_store_made(qbuild_workspace, tmp_path):
    ws = qbuild_workspace
    cache = tmp_path / "mycache"
    ws.write("qbuild.toml", f'[settings]\ncache_dir = "{cache.as_posix()}"\n')
    ws.write("p/a.txt", "alpha")
    ws.write("p/BUILD.toml", '[a]\nrule = "filegroup"\nsrcs = ["a.txt"]\n')
    assert ws.cli("build", "//p:a").code == 0
    (cache / "notes.txt").write_text("mine")
    assert ws.cli("clean", "--expunge").code == 0
    assert sorted(p.name for p in cache.iterdir()) == ["notes.txt"]


def test_symlinked_sources_outside_the_workspace_are_refused(ws, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("secret")
    ws.write("p/BUILD.toml", '[a]\nrule = "concat"\nsrcs = ["link.txt"]\n\n'
             '[g]\nrule = "concat"\nsrcs = ["*.txt"]\n')
    ws.path("p/link.txt").symlink_to(secret)
    for label in ("//p:a", "//p:g"):
        result = ws.build(label)
        assert result.exit_code == 2
        assert "is a symlink to" in result.error and "outside the workspace" in result.error
        assert "p/BUILD.toml" in result.error and "attribute 'srcs'" in result.error
    # Inside the workspace a symlink is just another name for a source file.
    ws.path("p/link.txt").unlink()
    ws.write("p/real.txt", "real")
    ws.path("p/link.txt").symlink_to("real.txt")
    assert ws.build("//p:a").output("//p:a").read_text() == "real"


def test_outputs_that_cannot_be_restored_fail_the_target_cleanly(ws):
    """A non-reproducible target whose blob is damaged reruns to different bytes: the
    target fails with one line (no crash, no stale path reported as built)."""
    ws.write("p/BUILD.toml", '[r]\nrule = "random"\n')
    first = ws.build("//p:r")
    text = first.output("//p:r").read_text()
    blob = _blob_holding(ws.cache_dir, text)
    os.chmod(blob, 0o644)
    blob.write_text("0" * len(text))
    first.output("//p:r").unlink()
    result = ws.build("//p:r")
    assert not result.ok and result.exit_code == 1
    assert "not deterministic" in result.failed["//p:r"]
    assert "//p:r" not in result._outputs


def test_a_command_sees_each_input_once_at_its_workspace_path(ws):
    """The engine stages a command's inputs once, where the command reads them (its
    declared layout), not in a folder of its own plus a workspace-shaped copy."""
    ws.write("p/a.txt", "alpha\n")
    ws.write("p/BUILD.toml", textwrap.dedent("""
        [dep]
        rule = "command"
        outs = ["d.txt"]
        cmd = "echo dep > $(OUT)"

        [t]
        rule = "command"
        srcs = ["a.txt", "a.txt", ":dep"]
        outs = ["files.lst"]
        cmd = "cat $(SRCS) > /dev/null && cd .. && find . -name '*.txt' | sort > ws/$(OUT)"
    """))
    result = ws.build("//p:t")
    assert result.ok, result.failed
    files = result.output("//p:t").read_text().split()
    assert files == ["./ws/p/a.txt", f"./ws/qbuild-out/{_folder('//p:dep')}/d.txt"]


LOOKER = """
[junk]
rule = "command"
srcs = ["a.txt"]
outs = ["j.txt"]
cmd = \"\"\"echo j > $(OUT) && touch ../left && mkdir -p ../deep/er ws-extra && \\
    touch ../deep/er/f && chmod 700 ../out\"\"\"

[slow]
rule = "command"
srcs = [":junk"]
outs = ["s.txt"]
cmd = \"\"\"for i in $(seq 1500); do [ -z "$(find {sandboxes} -maxdepth 2 -name left)" ] && \\
    break; sleep 0.02; done; cp $(SRCS) $(OUT)\"\"\"

[look]
rule = "command"
srcs = ["a.txt", ":slow"]
outs = ["seen.txt"]
cmd = \"\"\"cd .. && find . -path ./_action.log -prune -o -path './ws/$(OUT)' -prune -o \\
    -print | sort > ws/$(OUT) && ls -l -d . | cut -c1-10 >> ws/$(OUT)\"\"\"
"""


def test_a_reused_sandbox_looks_exactly_like_a_new_one(qbuild_workspace, tmp_path):
    """Sandboxes are emptied and reused within a build: whatever an action left (files,
    folders, a folder's mode) never reaches the next action, which sees what a new
    sandbox holds."""
    ws = qbuild_workspace
    ws.write("p/a.txt", "alpha\n")
    # slow waits (30 s at most) until junk's sandbox is emptied (its file 'left' gone)
    ws.write("p/BUILD.toml", LOOKER.format(sandboxes=ws.cache_dir / "tmp"))
    # junk, slow (while junk's sandbox is emptied), then look in what junk left
    reused = ws.build("//p:look", jobs=1)
    assert reused.ok, reused.failed
    from qbuild.testing import Workspace

    fresh_ws = Workspace(tmp_path / "ws2", tmp_path / "cache2")
    fresh_ws.write("p/a.txt", "alpha\n")
    fresh_ws.write("p/BUILD.toml", LOOKER.format(sandboxes=fresh_ws.cache_dir / "tmp"))
    assert fresh_ws.build("//p:slow", jobs=1).ok  # another build: its sandboxes are gone
    fresh = fresh_ws.build("//p:look", jobs=1)
    assert fresh.ok, fresh.failed
    seen = reused.output("//p:look").read_text()
    assert "left" not in seen and "deep" not in seen and "ws-extra" not in seen
    assert seen == fresh.output("//p:look").read_text()


def test_an_input_renamed_to_an_output_and_edited_with_its_mtime_restored_is_hashed(ws):
    # The output has the staged input's inode, size and mtime (only the ctime moved):
    # its bytes are not the input's, and neither it nor the untouched source's plain
    # filegroup may be given the other's.
    ws.write("p/a.txt", "abc\n")
    cmd = ("cp -p $(SRCS) ref && mv $(SRCS) $(OUT) && chmod u+w $(OUT) && "
           "printf X | dd of=$(OUT) conv=notrunc status=none && "
           "touch -r ref $(OUT) && chmod a-w $(OUT)")
    ws.write("p/BUILD.toml", textwrap.dedent("""
        [m]
        rule = "command"
        srcs = ["a.txt"]
        outs = ["o.txt"]
        cmd = "CMD"

        [fg]
        rule = "filegroup"
        srcs = ["a.txt"]
    """).replace("CMD", cmd))
    for _ in range(2):  # the second build is served from the cache
        result = ws.build("//p:m", "//p:fg", jobs=1)
        assert result.ok, result.error
        assert ws.path(f"qbuild-out/{_folder('//p:m')}/o.txt").read_text() == "Xbc\n"
        assert ws.path(f"qbuild-out/{_folder('//p:fg')}/a.txt").read_text() == "abc\n"
        ws.cli("clean")


def test_placing_a_target_another_process_is_placing_removes_none_of_its_files(
        ws, monkeypatch):
    # The other process is forced between our listing of the target's folder and our
    # cleanup of it: its copy of o.txt is still a temporary file (named for its pid and
    # thread), and it has already removed the stale file both of us found.
    ws.write("p/a.txt", "abc\n")
    ws.write("p/BUILD.toml", '[c]\nrule = "command"\nsrcs = ["a.txt"]\nouts = ["o.txt"]\n'
             'cmd = "cp $(SRCS) $(OUT)"\n')
    assert ws.build("//p:c").ok
    folder = ws.path(f"qbuild-out/{_folder('//p:c')}")
    ws.path("qbuild-out/.qbuild/state.json").unlink()  # so the folder is cleaned again
    theirs = folder / ".o.txt.424242.1.tmp"
    theirs.write_text("abc\n")
    stale = folder / "stale.txt"
    stale.write_text("from an older build")
    walk = os.walk

    def interleaved(top, *args, **kwargs):
        listing = list(walk(top, *args, **kwargs))
        if os.path.realpath(top) == os.path.realpath(folder):
            stale.unlink(missing_ok=True)  # the other process cleaned it first
        return iter(listing)

    monkeypatch.setattr(os, "walk", interleaved)
    result = ws.build("//p:c")
    monkeypatch.undo()
    assert result.ok, result.error
    assert (folder / "o.txt").read_text() == "abc\n"
    assert theirs.exists()  # its rename into place will find its file
    assert not stale.exists()


def test_a_copy_a_killed_process_left_in_a_target_folder_is_removed(ws):
    ws.write("p/a.txt", "abc\n")
    ws.write("p/BUILD.toml", '[c]\nrule = "command"\nsrcs = ["a.txt"]\nouts = ["o.txt"]\n'
             'cmd = "cp $(SRCS) $(OUT)"\n')
    assert ws.build("//p:c").ok
    folder = ws.path(f"qbuild-out/{_folder('//p:c')}")
    ws.path("qbuild-out/.qbuild/state.json").unlink()  # so the folder is cleaned again
    left = folder / ".o.txt.424242.1.tmp"
    left.write_text("ab")
    os.utime(left, (1, 1))  # not written to for decades: its writer is gone
    assert ws.build("//p:c").ok
    assert not left.exists() and (folder / "o.txt").read_text() == "abc\n"
