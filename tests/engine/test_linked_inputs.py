"""Dependency inputs of actions that declare ``link_inputs`` (the ``command`` rule) are
hard links to the cache's read-only blobs on filesystems without reflinks, so a big
output feeding several actions is never copied; an in-place edit of such a link (even by
root, or after a chmod) is detected after the action: the action fails, nothing of it is
cached, the blob is discarded, and any other action that read the same blob meanwhile
fails too instead of committing what it read."""

import os
import textwrap
from pathlib import Path

import pytest

from qbuild.core.files import has_reflinks

SIZE = 8 << 20


def _io():
    fields = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return int(fields["rchar"]), int(fields["wchar"])


def _blobs_holding(cache_dir, data):
    return [p for p in (cache_dir / "cas").rglob("*.val") if p.read_bytes() == data]


@pytest.fixture
def linking(qbuild_workspace):
    (qbuild_workspace.cache_dir / "tmp").mkdir(parents=True, exist_ok=True)
    if has_reflinks(qbuild_workspace.cache_dir / "tmp"):
        pytest.skip("this filesystem clones instead (tests/engine/test_reflink.py)")
    return qbuild_workspace


def test_a_big_output_reaches_two_commands_without_a_copy(linking):
    ws = linking
    data = os.urandom(SIZE)
    ws.write_bytes("p/big.bin", data)
    ws.write("p/BUILD.toml", textwrap.dedent("""
        [big]
        rule = "filegroup"
        srcs = ["big.bin"]

        [c1]
        rule = "command"
        srcs = [":big"]
        cmd = "stat -c %h $(SRCS) > $(OUT)"
        outs = ["c1.txt"]

        [c2]
        rule = "command"
        srcs = [":big"]
        cmd = "test ! -L $(SRCS) && cmp -s $(SRCS) /dev/null; echo $? > $(OUT)"
        outs = ["c2.txt"]

        [small]
        rule = "command"
        srcs = ["small.txt"]
        cmd = "cat $(SRCS) > $(OUT)"
        outs = ["s.txt"]
    """))
    ws.write("p/small.txt", "small")
    assert ws.build("//p:small").ok  # modules imported, commands found: not counted
    before = _io()
    result = ws.build("//p:c1", "//p:c2")
    read, written = (now - then for now, then in zip(_io(), before))
    assert result.ok, result.failed
    assert int(result.output("//p:c1").read_text()) >= 2  # a link to the blob
    assert result.output("//p:c2").read_text().strip() == "1"  # a real file, not empty
    # The source is read for its digest and copied once into the filegroup's sandbox
    # (what the store keeps); the consumers' inputs cost nothing (/proc/self/io counts
    # what the commands read too: cmp reads a few bytes).
    assert read < SIZE * 2.25, read
    assert written < SIZE * 1.25, written
    assert len(_blobs_holding(ws.cache_dir, data)) == 1
    for path in (ws.cache_dir / "tmp").rglob("*"):  # every sandbox link is gone
        assert not path.is_file() or path.stat().st_size != SIZE


BUILD = """
[a]
rule = "filegroup"
srcs = ["a.txt"]

[v]
rule = "command"
srcs = [":a"]
cmd = "{vandal}chmod u+w $(SRCS) && echo evil >> $(SRCS) && echo done > $(OUT){signal}"
outs = ["v.txt"]

[reader]
rule = "command"
srcs = [":a"]
cmd = "{reader}cat $(SRCS) > $(OUT)"
outs = ["r.txt"]
"""


def test_a_command_editing_its_linked_input_fails_and_the_blob_is_dropped(linking):
    ws = linking
    ws.write("p/a.txt", "alpha\n")
    ws.write("p/BUILD.toml", BUILD.format(vandal="", signal="", reader=""))
    result = ws.build("//p:v")
    error = result.failed["//p:v"]
    assert "input qbuild-out/p/@a/a.txt was modified while the action ran" in error
    assert "discarded" in error and "Traceback" not in error
    assert not _blobs_holding(ws.cache_dir, b"alpha\nevil\n")  # never served
    assert not _blobs_holding(ws.cache_dir, b"alpha\n")  # the linked blob is gone
    assert not any((ws.root / "qbuild-out" / "p" / "@v").rglob("*.txt"))
    again = ws.build("//p:reader")  # the filegroup runs again: the right bytes
    assert again.ok, again.failed
    assert again.output("//p:reader").read_text() == "alpha\n"
    assert _blobs_holding(ws.cache_dir, b"alpha\n")
    assert "//p:v" in ws.build("//p:v").failed  # every time, never a cached result


def test_a_reader_of_the_same_blob_never_commits_what_a_vandal_wrote(linking, tmp_path):
    ws = linking
    sync = tmp_path / "sync"
    sync.mkdir()
    wait = ("for i in $(seq 400); do [ -e {f} ] && break; sleep 0.05; done; "
            "[ -e {f} ] || exit 3; ")
    ws.write("p/a.txt", "alpha\n")
    ws.write("p/BUILD.toml", BUILD.format(
        vandal=wait.format(f=sync / "reading"),
        signal=f" && touch {sync / 'written'}",
        reader=f"touch {sync / 'reading'}; " + wait.format(f=sync / "written")))
    result = ws.build("//p:v", "//p:reader", jobs=3, keep_going=True)
    assert "was modified while the action ran" in result.failed["//p:v"]
    assert "was modified while the action ran" in result.failed["//p:reader"]
    assert not _blobs_holding(ws.cache_dir, b"alpha\nevil\n")
    (sync / "reading").unlink()
    (sync / "written").unlink()
    ws.write("p/BUILD.toml", BUILD.format(vandal="", signal="", reader=""))
    clean = ws.build("//p:reader")
    assert clean.ok, clean.failed
    assert clean.output("//p:reader").read_text() == "alpha\n"


def test_a_command_replacing_its_linked_input_fails_and_the_blob_stays(linking):
    ws = linking
    ws.write("p/a.txt", "alpha\n")
    ws.write("p/BUILD.toml", textwrap.dedent("""
        [a]
        rule = "filegroup"
        srcs = ["a.txt"]

        [r]
        rule = "command"
        srcs = [":a"]
        cmd = "rm -f $(SRCS) && echo other > $(SRCS) && cat $(SRCS) > $(OUT)"
        outs = ["r.txt"]
    """))
    result = ws.build("//p:r")
    error = result.failed["//p:r"]
    assert "another file was put in its place" in error and "discarded" not in error
    assert _blobs_holding(ws.cache_dir, b"alpha\n")  # the blob itself was not touched
