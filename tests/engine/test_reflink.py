"""On a filesystem with reflinks (XFS, btrfs), private copies cost no data I/O: a big
source through a ``filegroup`` to two consumers is read once (its digest) and written
never, and every copy stays private (writing to one leaves the others as they were).

Needs root and a loop-mounted XFS or btrfs image (made here); skipped otherwise.
"""

import os
import shutil
import subprocess
import tempfile
import textwrap
from pathlib import Path

import pytest

from qbuild.core.files import clone_or_copy, hash_file
from qbuild.testing import Workspace

_SIZE = 24 << 20


def _try(*argv):
    return subprocess.run(argv, capture_output=True, check=False).returncode == 0


@pytest.fixture(scope="module")
def reflink_dir():
    if os.geteuid() != 0:
        pytest.skip("mounting a loop filesystem needs root")
    base = Path(tempfile.mkdtemp(prefix="qbuild-reflink-"))
    image, mount = base / "fs.img", base / "mnt"
    mount.mkdir()
    with open(image, "wb") as handle:
        handle.truncate(320 << 20)
    made = (shutil.which("mkfs.xfs") and _try("mkfs.xfs", "-q", "-m", "reflink=1",
                                                str(image))) or \
        (shutil.which("mkfs.btrfs") and _try("mkfs.btrfs", "-q", str(image)))
    if not made or not _try("mount", "-o", "loop", str(image), str(mount)):
        shutil.rmtree(base, ignore_errors=True)
        pytest.skip("no XFS/btrfs tools or loop mounting not allowed here")
    try:
        yield mount
    finally:
        if not _try("umount", str(mount)):
            _try("umount", "-l", str(mount))  # still busy: detach it now, free it later
        shutil.rmtree(base, ignore_errors=True)


def _io():
    fields = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return int(fields["rchar"]), int(fields["wchar"])


def test_clone_is_a_private_copy_without_data_io(reflink_dir):
    source = reflink_dir / "a.bin"
    source.write_bytes(os.urandom(_SIZE))
    digest = hash_file(source)
    before = _io()
    clone_or_copy(source, reflink_dir / "b.bin")
    read, written = (now - then for now, then in zip(_io(), before))
    assert read < _SIZE // 8 and written < _SIZE // 8
    with open(reflink_dir / "b.bin", "r+b") as handle:
        handle.write(b"changed")
    assert hash_file(source) == digest  # the clone was private


BUILD = """
[big]
rule = "filegroup"
srcs = ["big.bin"]

[c1]
rule = "command"
srcs = [":big"]
cmd = "test -s $(SRCS) && echo one > $(OUT)"
outs = ["c1.txt"]

[c2]
rule = "command"
srcs = [":big"]
cmd = "test -s $(SRCS) && echo two > $(OUT)"
outs = ["c2.txt"]
"""


def test_a_big_source_to_two_consumers_is_read_once_and_never_copied(reflink_dir):
    ws = Workspace(reflink_dir / "ws", reflink_dir / "cache")
    data = os.urandom(_SIZE)
    ws.write_bytes("pkg/big.bin", data)
    ws.write("pkg/BUILD.toml", textwrap.dedent(BUILD))
    before = _io()  # (what reaped children read counts too: the commands read nothing)
    result = ws.build("//pkg:c1", "//pkg:c2", "//pkg:big")
    read, written = (now - then for now, then in zip(_io(), before))
    assert result.ok, result.failed
    assert sorted(result.ran) == ["//pkg:big", "//pkg:c1", "//pkg:c2"]
    # One read to digest the source; the staged copies, the stored blob and the two
    # consumers' inputs are reflinks (the filegroup's output is not hashed again).
    assert read < _SIZE * 1.25, read
    assert written < _SIZE // 4, written
    assert result.output("//pkg:big").read_bytes() == data  # a private copy, placed
    assert ws.path("pkg/big.bin").read_bytes() == data
