"""In a build the store moves an adopted blob into ``cas/`` at once and writes its index
row later, with others, in ``make_durable``: only after the blob's file (and its folder)
were fsync'ed, and always before an action entry that names it. These tests try to break
that: another process must not find a row whose file is not durable, this process must
find its own blobs at once, and a dropped blob must never get a row."""

import os

from qbuild.core.files import hash_file
from qbuild.store import local as _store
from qbuild.store.local import LocalStore


def _blob(tmp, name, data):
    path = tmp / name
    path.write_bytes(data)
    return path, hash_file(path), os.stat(path)


def test_rows_are_written_after_the_files_are_durable(tmp_path, monkeypatch):
    store = LocalStore(tmp_path / "cache")
    store.defer_sync()
    path, digest, st = _blob(store.tmp, "out", b"payload")
    assert store.put_blob(path, digest, adopt=True, hashed=st)
    assert not path.exists()
    assert store.has_blob(digest)  # this process finds it at once
    mine = store._blob_row(digest)
    assert mine is not None and mine.read_bytes() == b"payload"
    other = LocalStore(tmp_path / "cache")  # another process: no row yet
    assert not other.has_blob(digest)

    order = []
    fsync, write_rows = _store._fsync, LocalStore._write_rows
    monkeypatch.setattr(_store, "_fsync", lambda p: (order.append(("fsync", p)), fsync(p)))
    monkeypatch.setattr(LocalStore, "_write_rows",
                        lambda self, rows: (order.append(("rows", len(rows))),
                                            write_rows(self, rows)))
    store.make_durable()
    assert ("fsync", str(mine)) in order and ("fsync", str(mine.parent)) in order
    assert order[-1] == ("rows", 1)  # after every fsync
    assert other.has_blob(digest) and other._blob_row(digest) == mine
    assert store._fresh == {}
    store.close()
    other.close()


def test_an_entry_is_never_written_before_the_rows_of_its_blobs(tmp_path):
    from qbuild.core.records import ActionResult, OutputEntry

    store = LocalStore(tmp_path / "cache")
    store.defer_sync()
    path, digest, st = _blob(store.tmp, "out", b"entry payload")
    store.put_blob(path, digest, adopt=True, hashed=st)
    result = ActionResult((OutputEntry("o", digest, 13, False),), ("o",))
    store.put_results([("k" * 64, {"parts": 1}, result)])
    other = LocalStore(tmp_path / "cache")
    entry = other.get_action("k" * 64)
    assert entry is not None and [o.digest for o in entry.outputs] == [digest]
    assert other.has_blob(digest)
    store.close()
    other.close()


def test_a_dropped_fresh_blob_gets_no_row_and_leaves_no_file(tmp_path):
    store = LocalStore(tmp_path / "cache")
    store.defer_sync()
    path, digest, st = _blob(store.tmp, "out", b"doomed")
    store.put_blob(path, digest, adopt=True, hashed=st)
    placed = store._blob_row(digest)
    store.discard_blob(digest, (os.stat(placed).st_dev, os.stat(placed).st_ino))
    assert not placed.exists() and not store.has_blob(digest)
    store.make_durable()
    other = LocalStore(tmp_path / "cache")
    assert not other.has_blob(digest)
    store.close()
    other.close()


def test_a_damaged_fresh_blob_is_not_restored(tmp_path):
    store = LocalStore(tmp_path / "cache")
    store.defer_sync()
    path, digest, st = _blob(store.tmp, "out", b"original bytes")
    store.put_blob(path, digest, adopt=True, hashed=st)
    placed = store._blob_row(digest)
    os.chmod(placed, 0o644)
    placed.write_bytes(b"damaged bytes!")  # moves its mtime and ctime: no longer trusted
    assert not store.restore_blob(digest, tmp_path / "restored")
    assert not (tmp_path / "restored").exists() and not store.has_blob(digest)
    store.make_durable()
    assert not LocalStore(tmp_path / "cache").has_blob(digest)
    store.close()


def test_source_digests_are_remembered_in_batches_and_at_close(tmp_path):
    digest = "ab" * 32
    store = LocalStore(tmp_path / "cache")
    store.memo_put("1:2:3:4:5", digest)
    assert store.memo_get("1:2:3:4:5") == digest  # this process sees it at once
    for i in range(_store._MEMO_BATCH):  # a full batch is written in one transaction
        store.memo_put(f"9:{i}:3:4:5", digest)
    other = LocalStore(tmp_path / "cache")
    assert other.memo_get("9:0:3:4:5") == digest
    store.memo_put("7:7:7:7:7", digest)
    assert other.memo_get("7:7:7:7:7") is None
    store.close()  # the rest at close
    assert other.memo_get("7:7:7:7:7") == digest
    other.close()
