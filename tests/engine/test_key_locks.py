"""Action key locks (``qbuild.store.keylock``): keys sharing a lock file's prefix do not wait
for each other inside one process, while the same key still waits (in another thread,
or in another process through the shared lock file)."""

import subprocess
import sys
import threading
import time

from qbuild.store.keylock import KeyLocks

A = "abc" + "0" * 61
B = "abc" + "1" * 61  # same prefix as A: the same lock file


def _in_thread(function):
    done = threading.Event()
    box = {}

    def run():
        box["value"] = function()
        done.set()

    threading.Thread(target=run, daemon=True).start()
    return done, box


def test_keys_sharing_a_prefix_do_not_wait_for_each_other(tmp_path):
    locks = KeyLocks(tmp_path)
    held = locks.acquire(A)  # as an entry waiting for its batched commit holds it
    done, box = _in_thread(lambda: locks.acquire(B))
    assert done.wait(10), "a key waited for another key of its lock file's prefix"
    box["value"].release()
    held.release()


def test_the_same_key_waits_in_another_thread(tmp_path):
    locks = KeyLocks(tmp_path)
    held = locks.acquire(A)
    other = locks.acquire(B)
    done, box = _in_thread(lambda: locks.acquire(A))
    assert not done.wait(0.3)
    other.release()  # another key of the prefix leaving does not let it in
    assert not done.wait(0.3)
    held.release()
    assert done.wait(10)
    box["value"].release()
    held.release()  # a second release does nothing
    assert locks._held == {}


def test_another_process_holding_the_lock_file_blocks_every_key_of_it(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, time\n"
        f"fd = os.open({str(tmp_path / 'abc')!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('locked', flush=True)\ntime.sleep(60)\n")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        locks = KeyLocks(tmp_path)
        first, box_a = _in_thread(lambda: locks.acquire(A))
        second, box_b = _in_thread(lambda: locks.acquire(B))
        assert not first.wait(0.3) and not second.wait(0.1)
    finally:
        holder.kill()
        holder.wait()
    assert first.wait(10) and second.wait(10)
    box_a["value"].release()
    # The file lock is kept while any key of its prefix is held here.
    probe = [sys.executable, "-c", (
        "import fcntl, os, sys\n"
        f"fd = os.open({str(tmp_path / 'abc')!r}, os.O_RDWR)\n"
        "try:\n    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
        "except OSError:\n    sys.exit(1)\n")]
    assert subprocess.run(probe).returncode == 1
    box_b["value"].release()
    deadline = time.monotonic() + 10
    while subprocess.run(probe).returncode != 0:
        assert time.monotonic() < deadline, "the lock file was not released"
        time.sleep(0.05)


def test_an_unopenable_lock_folder_gives_no_lock(tmp_path):
    locks = KeyLocks(tmp_path / "missing")
    assert locks.acquire(A) is None
    assert locks.acquire(A) is None  # and leaves nothing behind that would block
    assert locks._held == {}


TAKER = """
import fcntl, sys
from pathlib import Path
try:
    from qbuild.store.keylock import KeyLocks
except ImportError:  # the flat layout before the engine's sub-packages
    from qbuild._keylock import KeyLocks
real, paused = fcntl.flock, []

def flock(fd, op):  # stop once between opening the lock file and locking it
    if not paused:
        paused.append(1)
        print("opened", flush=True)
        sys.stdin.readline()
    return real(fd, op)

fcntl.flock = flock
lock = KeyLocks(Path(sys.argv[1])).acquire(sys.argv[2])
print("held" if lock is not None else "none", flush=True)
sys.stdin.readline()
"""


def test_gc_removing_a_lock_file_while_another_process_takes_it_keeps_the_key_locked(
        tmp_path):
    # Suspected in issue 24, proven: gc unlinks every lock file it can lock; a process
    # that opened one and had not locked it yet then locked a deleted file, and the
    # next process made a new file at that name and ran the same key at the same time.
    try:
        from qbuild.store.keylock import flock_fd
        from qbuild.store.local import LocalStore
    except ImportError:
        from qbuild._keylock import flock_fd
        from qbuild._store import LocalStore
    import os

    store = LocalStore(tmp_path / "cache")
    folder = store.locks
    taker = subprocess.Popen([sys.executable, "-c", TAKER, str(folder), A],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert taker.stdout.readline() == "opened\n"
        store.gc(10**12)  # finds the lock file unlocked, and removes it
        taker.stdin.write("\n")
        taker.stdin.flush()
        assert taker.stdout.readline() == "held\n"
        other = flock_fd(folder / A[:3], os.O_RDWR | os.O_CREAT, wait=False)
        if other is not None:
            os.close(other)
        assert other is None, "a second process got the lock of a key that is held"
    finally:
        taker.stdin.close()
        taker.wait(timeout=60)
        store.close()
