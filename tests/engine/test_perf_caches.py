"""The engine's speed-ups never change an answer: each cache or shortcut added for
speed (issue 10, "Scale and I/O") is tried here with the edit that must defeat it."""

import os


def _filegroup(ws):
    ws.write("p/a.txt", "a\n")
    ws.write("p/BUILD.toml", """
        [g]
        rule = "filegroup"
        srcs = ["a.txt"]
    """)


def test_full_path_keeps_placed_outputs(ws):
    """A build on the full path leaves outputs that are already in place alone (it used
    to forget where it had placed them and copy every output again)."""
    _filegroup(ws)
    first = ws.cli("build", "//p:g")
    assert first.code == 0, first.stderr
    out = ws.path("qbuild-out/p/@g/a.txt")
    before = os.stat(out)
    again = ws.cli("build", "--explain", "//p:g")
    assert again.code == 0, again.stderr
    after = os.stat(out)
    assert (after.st_ino, after.st_ctime_ns) == (before.st_ino, before.st_ctime_ns)
    assert out.read_text() == "a\n"


def test_sandboxes_are_gone_when_the_build_returns(ws):
    """Sandboxes are deleted in the background, but all of them before the build ends."""
    for i in range(6):
        ws.write(f"p/f{i}.txt", f"{i}\n")
    ws.write("p/BUILD.toml", "\n".join(
        f'[g{i}]\nrule = "filegroup"\nsrcs = ["f{i}.txt"]\n' for i in range(6)))
    result = ws.build("//p:all", jobs=2)
    assert result.ok, result.error
    assert sorted(os.listdir(ws.cache_dir / "tmp")) == []


def test_a_damaged_fresh_blob_is_still_caught(tmp_path):
    """A blob this process stored from a file it hashed is trusted (not hashed again
    when placed) only while it keeps the stat it was stored with."""
    from qbuild._digest import hash_file
    from qbuild._store import LocalStore

    store = LocalStore(tmp_path / "cache")
    try:
        for damage in (False, True):
            out = store.tmp / f"out{damage}"
            out.write_bytes(b"x" * 1000 + bytes([damage]))
            st = os.stat(out)
            digest = hash_file(out)
            store.put_blob(out, digest, adopt=True, hashed=st)
            blob = store._blob_path(digest)
            if damage:
                os.chmod(blob, 0o644)
                with open(blob, "r+b") as handle:
                    handle.write(b"y")
            dest = tmp_path / f"placed{damage}"
            assert store.restore_blob(digest, dest) is not damage
            if not damage:
                assert hash_file(dest) == digest
    finally:
        store.close()
