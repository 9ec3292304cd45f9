"""Where an action runs on this machine: its private sandbox folder and, for a heavy
action, a worker process.

Owns, through one ``Sandboxes`` object per executor:

- sandbox folders under the store's ``tmp/``: made and locked (``new_sandbox``; the lock
  tells a live sandbox from one a killed build left, which ``clean_stale_sandboxes``
  sweeps), handed to a background thread that deletes them or empties them for the next
  action of the same shape (``Sandbox``, ``SandboxFolders``), and the private folder
  forwarded sources are copied to;
- the pool of worker processes heavy actions run in (``Sandboxes.run_in_worker``), and
  killing every process actions started (``kill_children``);
- the traffic between a sandbox and the store: staging source files into it, checking
  after the action that no input, staged or linked to a blob, was written to and that
  no source changed, and moving the declared outputs into the store.

What is staged where and which function runs is the executors' (``local`` for a v1
rule's ``run``, ``actions`` for a v2 target's declared actions).
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.errors import RuleError
from ..core.files import copy_new, copy_new_hashing, hash_file, stat_key
from ..core.protocols import Store
from ..core.records import OutputEntry, TargetActions
from ..store.digests import SourceDigests
from ..store.keylock import flock_fd
from .failures import ActionFailed, log_tail
from .linked import Linked, modified

if TYPE_CHECKING:
    import concurrent.futures

_YOUNG = 60.0  # seconds: a sandbox folder this new may not be locked yet (mkdir, then flock)


def _try_lock(path: Path) -> int | None:
    """A lock on the file ``path`` (made if missing)."""
    return flock_fd(path, os.O_RDWR | os.O_CREAT, wait=False)


def _lock_folder(path: Path) -> int | None:
    """A lock on the folder ``path`` itself (None also where folders cannot be locked)."""
    return flock_fd(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, wait=False)


def new_sandbox(tmp: Path) -> tuple[Path, int | None, bool]:
    """A new sandbox folder under ``tmp``, locked while it lives: (folder, lock fd, whether
    the lock is a ``<folder>.lock`` file). The folder itself is locked (no file to make
    and delete per action) where the filesystem allows it, else a lock file next to it,
    taken before the folder exists."""
    name = f"{os.getpid()}-{os.urandom(6).hex()}"
    sandbox = tmp / name
    sandbox.mkdir(parents=True)
    lock = _lock_folder(sandbox)
    if lock is not None:
        return sandbox, lock, False
    return sandbox, _try_lock(tmp / f"{name}.lock"), True


def clean_stale_sandboxes(tmp: Path) -> None:
    """Remove sandboxes left by killed qbuild processes: a live sandbox is locked by its
    process (an flock on the folder, or on its ``.lock`` file; flocks work across PID
    namespaces sharing a cache, unlike a PID check), so a lock we can take belongs to a
    dead process. A folder is locked right after it is made, so only folders older than
    a minute are tried."""
    try:
        entries = list(tmp.iterdir())
    except OSError:
        return
    names = {entry.name for entry in entries}
    now = time.time()
    for entry in entries:
        if entry.name.endswith(".lock"):
            fd = _try_lock(entry)
            if fd is None:
                continue
            try:
                shutil.rmtree(tmp / entry.name[:-5], ignore_errors=True)
                entry.unlink(missing_ok=True)
            finally:
                os.close(fd)
        elif f"{entry.name}.lock" not in names:
            try:
                if now - entry.stat().st_mtime < _YOUNG:
                    continue
            except OSError:
                continue
            fd = _lock_folder(entry)
            if fd is None:
                continue
            try:
                shutil.rmtree(entry, ignore_errors=True)
            finally:
                os.close(fd)


def _worker_init(parent: int) -> None:
    """Worker processes ignore Ctrl-C (the main process ends them) and exit when the
    main process is gone, even after kill -9 (they would otherwise hold its pipes)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    # Polling the parent rather than PR_SET_PDEATHSIG: that fires when the *thread*
    # that started the worker ends, which a thread pool does at will.
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()
    if os.getppid() != parent:
        os._exit(1)


def _new_pool(workers: int) -> concurrent.futures.ProcessPoolExecutor:
    # Imported here: a no-op build never starts a worker.
    import concurrent.futures
    import multiprocessing

    return concurrent.futures.ProcessPoolExecutor(
        max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
        initializer=_worker_init, initargs=(os.getpid(),))


def _descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (Linux /proc; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(name))
    out, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            out.append(child)
            stack.append(child)
    return out


def kill_children() -> None:
    """SIGKILL every descendant process and the process groups they lead (the commands
    actions started in their own sessions, the worker processes)."""
    own_group = os.getpgrp()
    for pid in _descendants(os.getpid()):
        try:
            group = os.getpgid(pid)
            if group != own_group:
                os.killpg(group, signal.SIGKILL)
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


class SandboxFolders:
    """The folders of one sandbox made so far: each new one costs one ``mkdir``, with
    no failed attempts (``Path.mkdir(parents=True)`` tries the deepest first). In a
    reused sandbox, the (empty) folders the last action left are taken as they are, and
    those this action does not use are removed (``prune``), so every action sees exactly
    the folders a new sandbox would have."""

    def __init__(self, root: Path, kept: set[Path] | None = None) -> None:
        self.known = {root}
        self.root = root
        self.kept = (kept or set()) - {root}

    def make(self, path: Path) -> Path:
        """The folder ``path`` (and its parents) in the sandbox, made if missing."""
        if path not in self.known:
            self.make(path.parent)
            if path not in self.kept:
                try:
                    os.mkdir(path)
                except FileExistsError:
                    pass
            self.known.add(path)
        return path

    def prune(self) -> None:
        """Remove the folders a reused sandbox had that this action did not make."""
        for path in sorted(self.kept - self.known, key=lambda p: len(p.parts),
                           reverse=True):
            try:
                os.rmdir(path)
            except OSError:
                shutil.rmtree(path)
        self.kept = set()


class Sandbox:
    """A private folder for one action (``path``), locked while it lives (see
    ``clean_stale_sandboxes``): ``lock`` is the lock's fd, ``lock_file`` whether it is
    held on a ``<folder>.lock`` file. ``folders`` makes its folders; a sandbox opened
    for ``reuse`` is emptied, not deleted, when discarded, keeping the folders made
    (``mode``: the mode they must still have to be kept)."""

    def __init__(self, path: Path, lock: int | None, lock_file: bool, reuse: bool,
                 mode: int = 0, kept: set[Path] | None = None) -> None:
        self.path = path
        self.lock = lock
        self.lock_file = lock_file
        self.reuse = reuse
        self.mode = mode
        self.folders = SandboxFolders(path, kept)


class Sandboxes:
    """The sandboxes and worker processes of one executor, over ``store`` (its ``tmp/``
    holds the sandboxes, and outputs go into it) and the workspace at ``root`` (where
    source files are staged from, checked against ``digests``); ``jobs`` worker
    processes at most.

    Finished sandboxes are deleted in a background thread, off the actions' critical
    path; the worker pool is started by the first heavy action. ``shutdown`` waits for
    both, ``kill`` stops at once."""

    def __init__(self, store: Store, root: Path, digests: SourceDigests, jobs: int) -> None:
        self.store = store
        self.root = root
        self.digests = digests
        self.jobs = jobs
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._lock = threading.Lock()
        self._trash = _Trash()
        self._forward: tuple[Path, int | None, bool] | None = None  # see forward_dir

    def open(self, reuse: bool) -> Sandbox:
        """A sandbox for one action. With ``reuse``, an emptied one a finished action
        left if there is one (its folders kept), and the sandbox is emptied for the next
        action when discarded; otherwise a new one, deleted when discarded."""
        if not reuse:
            return Sandbox(*new_sandbox(self.store.tmp), reuse=False)
        reused = self._trash.take()
        if reused is not None:
            folder, held, kept, kept_mode = reused
            return Sandbox(folder, held, False, True, kept_mode, kept)
        path, lock, lock_file = new_sandbox(self.store.tmp)
        mode = os.fstat(lock).st_mode if lock is not None and not lock_file else 0
        return Sandbox(path, lock, lock_file, True, stat.S_IMODE(mode))

    def discard(self, box: Sandbox) -> None:
        """Hand a finished sandbox to the background thread that deletes it (or empties
        it for the next action, if it was opened for reuse): deleting folders costs more
        than making them, and the action's result need not wait for it."""
        self._trash.put(box.path, box.lock, box.lock_file,
                        box.folders.known if box.reuse else None, box.mode)

    def forward_dir(self) -> Path:
        """A private folder in the store's ``tmp/`` (locked like a sandbox while this
        object lives, so a killed build's is swept) where forwarded sources are copied
        before they are moved into the store (``actions._forward``)."""
        with self._lock:
            if self._forward is None:
                path, lock, lock_file = new_sandbox(self.store.tmp)
                self._forward = (path, lock, lock_file)
            return self._forward[0]

    def run_in_worker(self, action: TargetActions, log_path: Path, function: Any, *args: Any
                      ) -> Any:
        """``function(*args)`` in a worker process of the pool (started on first use);
        ``action`` and its log at ``log_path`` are named if the worker dies."""
        from concurrent.futures.process import BrokenProcessPool

        with self._lock:  # one pool, however many actions ask at once
            if self._pool is None:
                self._pool = _new_pool(self.jobs)
            pool = self._pool
        # A worker killed (out of memory) breaks the whole pool and every action in
        # flight on it: each of those runs once more in a worker of its own, so only the
        # action that kills its worker fails.
        try:
            return pool.submit(function, *args).result()
        except BrokenProcessPool:
            with self._lock:
                if self._pool is pool:
                    self._pool = None
                    pool.shutdown(wait=False, cancel_futures=True)
        alone = _new_pool(1)
        try:
            return alone.submit(function, *args).result()
        except BrokenProcessPool:
            raise ActionFailed(RuleError("the worker process died (killed or out of memory)",
                                         target=str(action.label)),
                               log_tail(log_path)) from None
        finally:
            alone.shutdown(wait=False, cancel_futures=True)

    def stage_source(self, action: TargetActions, rel: str, key: str, dest: Path) -> str:
        """Copy the source file ``rel`` of ``action`` to ``dest`` in a sandbox, read-only,
        checking that it is still the file whose digest the key holds (stat key ``key``
        before and after the copy); returns the copy's stat key."""
        return stat_key(self.copy_source(action, rel, key, dest))

    def copy_source(self, action: TargetActions, rel: str, key: str, dest: Path) -> os.stat_result:
        """``stage_source``, returning the copy's stat. A digest this process did not
        hash itself (taken from the stat memo or the workspace's record of digests,
        which a damaged or tampered cache can have wrong) is checked on the way: the
        copy is hashed as it is made, and a mismatch fails the action, corrects the
        memo and caches nothing under a key made from the wrong digest."""
        path = self.root / rel
        digest = action.sources[rel][0]
        actual = None
        try:
            if self.digests.hashed(key):
                before, after, copied = copy_new(path, dest)
            else:
                before, after, copied, actual = copy_new_hashing(path, dest)
        except OSError as exc:
            raise ActionFailed(RuleError(f"cannot read input {rel}: {exc.strerror}",
                                         target=str(action.label)), started=False) from None
        if stat_key(before) != key or stat_key(after) != key:
            raise ActionFailed(RuleError(f"input {rel} changed while the build ran; its "
                                         "result was not cached. Run the build again.",
                                         target=str(action.label)), started=False)
        if actual is not None and actual != digest:
            self.digests.correct(key, actual)
            raise ActionFailed(RuleError(
                f"input {rel} does not hold the content its remembered digest says (a "
                "damaged cache memo or qbuild-out/.qbuild/digests.json); corrected it and "
                "cached nothing. Run the build again.", target=str(action.label)),
                started=False)
        return copied

    def check_linked_inputs(self, action: TargetActions, sandbox: Path, linked: list[Linked]
                            ) -> None:
        """Fail an action that wrote to an input linked to a cache blob (``linked``);
        the blob is discarded, so neither this nor any other build is served it."""
        bad = modified(self.store, linked)
        if bad:
            item, why, discarded = bad[0]
            base = sandbox / "ws"  # where a layout stages inputs (as the rule sees them)
            where = item.dest.relative_to(base if item.dest.is_relative_to(base)
                                          else sandbox).as_posix()
            dropped = (f" and the cache's copy of that input ({item.digest[:12]}) was "
                       "discarded (it is rebuilt when needed)") if discarded else ""
            raise ActionFailed(RuleError(
                f"input {where} was modified while the action ran ({why}); its result "
                f"was not cached{dropped}. Inputs are read-only: write outputs instead",
                target=str(action.label)))

    def check_staged_inputs(self, action: TargetActions, sandbox: Path,
                            staged: dict[Path, tuple[str, str]],
                            shown: Callable[[str], str] = str) -> None:
        """Fail an action whose rule wrote into one of its (read-only) inputs, staged as
        ``staged`` (path: (digest, stat key)): its outputs may come from the edited
        bytes, not from what the key names. ``shown`` names a sandbox-relative path as
        the user knows it (a source's or a dependency output's workspace path)."""
        for path, (digest, key) in staged.items():
            try:
                st = os.lstat(path)
            except OSError:
                continue  # moved or deleted inside the sandbox: no harm done
            if stat_key(st) != key and (not path.is_file() or hash_file(path) != digest):
                raise ActionFailed(RuleError(
                    f"the rule modified its input {shown(path.relative_to(sandbox).as_posix())}; "
                    "inputs are read-only: write outputs instead",
                    target=str(action.label)))

    def check_sources(self, action: TargetActions) -> None:
        """Fail an action whose source files in the workspace changed while it ran."""
        for path, (digest, key) in action.sources.items():
            if not self.digests.still(self.root / path, digest, key):
                raise ActionFailed(RuleError(
                    f"input {path} changed while the action ran; its result was not "
                    "cached. Run the build again.", target=str(action.label)))

    def collect_outputs(self, action: TargetActions, out_root: Path, log_path: Path,
                        names: tuple[str, ...] | None = None,
                        forwarded: dict[Path, tuple[str, str]] | None = None
                        ) -> list[OutputEntry]:
        """The declared outputs (``names``, else the action's), found under ``out_root``,
        hashed and stored. Only for the engine's own ``forward_files``, which moves its
        staged inputs (``forwarded``) into place and writes nothing, is an output that
        is one of them (same inode, size and mtime, still read-only) not hashed again.
        Any other action's word is not taken: one that renames an input to its output,
        edits it and sets the mtime back leaves exactly those stats."""
        known: dict[tuple[int, int], tuple[str, int, int]] = {}
        for digest, key in (forwarded or {}).values():
            dev, ino, size, mtime = key.split(":")[:4]
            known[(int(dev), int(ino))] = (digest, int(size), int(mtime))
        entries = []
        for name in action.outputs if names is None else names:
            path = out_root / name.rstrip("/")
            if name.endswith("/"):
                if not path.is_dir() or path.is_symlink():
                    raise ActionFailed(RuleError(f"the rule did not create declared output "
                                                 f"directory '{name}'", target=str(action.label)),
                                       log_tail(log_path))
                files = sorted(p for p in path.rglob("*") if p.is_file() or p.is_symlink())
            else:
                files = [path]
            for file in files:
                try:
                    st = os.lstat(file)
                except OSError:
                    st = None
                if st is not None and stat.S_ISLNK(st.st_mode) and (
                        name.endswith("/") or file.is_file()):
                    raise ActionFailed(RuleError(f"output {file.relative_to(out_root)} is a "
                                                 "symlink; write real files",
                                                 target=str(action.label)))
                if st is None or not stat.S_ISREG(st.st_mode):
                    raise ActionFailed(RuleError(f"the rule did not write declared output "
                                                 f"'{name}'", target=str(action.label)),
                                       log_tail(log_path))
                seen = known.get((st.st_dev, st.st_ino))
                if seen is not None and seen[1:] == (st.st_size, st.st_mtime_ns) and \
                        not st.st_mode & 0o222:
                    digest = seen[0]
                else:
                    digest = hash_file(file)
                self.store.put_blob(file, digest, adopt=True,  # the sandbox is thrown away
                                    hashed=st)
                entries.append(OutputEntry(file.relative_to(out_root).as_posix(), digest,
                                           st.st_size, bool(st.st_mode & stat.S_IXUSR)))
        return entries

    def shutdown(self) -> None:
        """Wait for the worker processes to end and every finished sandbox to be
        deleted, then delete the sandboxes kept for reuse and the forwarding folder."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self._trash.drain()
        forward, self._forward = self._forward, None
        if forward is not None:
            _Trash.delete(*forward)

    def kill(self) -> None:
        """Stop at once: kill the worker processes and every process actions started."""
        pool, self._pool = self._pool, None
        kill_children()
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


class _Trash:
    """Deletes finished sandboxes in one background thread, off the actions' critical
    path (deleting a sandbox's folders costs more than setting them up). A sandbox keeps
    its lock until it is gone, so no other process's sweep touches it meanwhile; one left
    by a process that died is swept by the next build (``clean_stale_sandboxes``).

    A sandbox handed over with the folders its action used (``kept``) is emptied instead
    and, if every one of those folders is still a plain folder with its original mode,
    kept (locked) for the next action, which then makes only the folders it lacks and
    removes those it does not use (``take``): a build of many actions of one shape makes
    and deletes no folder per action. What is left at the end of the build is deleted."""

    LIMIT = 16  # sandboxes kept for reuse

    def __init__(self) -> None:
        self._queue: Any = None
        self._thread: threading.Thread | None = None
        self._start = threading.Lock()
        self._pool: list[tuple[Path, int, set[Path], int]] = []
        self._pool_lock = threading.Lock()

    def put(self, sandbox: Path, lock: int | None, lock_file: bool = True,
            kept: set[Path] | None = None, mode: int = 0) -> None:
        import queue

        with self._start:
            if self._thread is None:
                self._queue = queue.SimpleQueue()
                self._thread = threading.Thread(target=self._run, args=(self._queue,),
                                                name="qbuild-trash", daemon=True)
                self._thread.start()
            self._queue.put((sandbox, lock, lock_file, kept, mode))

    def take(self) -> tuple[Path, int, set[Path], int] | None:
        """An emptied, locked sandbox (folder, lock fd, its folders, their mode), if any."""
        with self._pool_lock:
            return self._pool.pop() if self._pool else None

    def _run(self, items: Any) -> None:
        while (item := items.get()) is not None:
            sandbox, lock, lock_file, kept, mode = item
            if kept is not None and lock is not None and not lock_file:
                try:
                    left = _empty(sandbox, kept, mode)
                except Exception:  # noqa: BLE001 - deleted instead
                    left = None
                if left is not None:
                    with self._pool_lock:
                        if len(self._pool) < self.LIMIT:
                            self._pool.append((sandbox, lock, left, mode))
                            continue
            self.delete(sandbox, lock, lock_file)

    @staticmethod
    def delete(sandbox: Path, lock: int | None, lock_file: bool) -> None:
        """Delete a sandbox, then release its lock."""
        try:
            _remove_tree(sandbox)
        except Exception:  # noqa: BLE001 - left for the next build's sweep
            pass
        if lock is not None:
            if lock_file:
                sandbox.with_name(f"{sandbox.name}.lock").unlink(missing_ok=True)
            os.close(lock)

    def drain(self) -> None:
        """Wait until every sandbox handed over so far is deleted (or emptied), then
        delete the ones kept for reuse."""
        with self._start:
            thread, items = self._thread, self._queue
            self._thread = self._queue = None
        if thread is not None:
            items.put(None)
            thread.join()
        with self._pool_lock:
            pool, self._pool = self._pool, []
        for sandbox, lock, _kept, _mode in pool:
            self.delete(sandbox, lock, False)


def _empty(root: Path, kept: set[Path], mode: int) -> set[Path] | None:
    """Delete everything in the sandbox ``root`` except the folders in ``kept`` that are
    still plain folders of mode ``mode`` (each left empty); returns the folders left, or
    None if the sandbox cannot be reused (its own mode changed)."""
    if stat.S_IMODE(os.lstat(root).st_mode) != mode:
        return None
    left = {root}
    stack = [root]
    while stack:
        folder = stack.pop()
        with os.scandir(folder) as entries:
            for entry in entries:
                path = Path(entry.path)
                if entry.is_dir(follow_symlinks=False):
                    if path in kept and stat.S_IMODE(
                            entry.stat(follow_symlinks=False).st_mode) == mode:
                        left.add(path)
                        stack.append(path)
                    else:
                        _remove_tree(path)
                else:
                    os.unlink(path)
    return left


def _remove_tree(path: Path) -> None:
    """Delete a sandbox, even its read-only inputs and folders a rule made read-only."""
    def retry(function: Any, name: str, _exc: Any) -> None:
        try:
            os.chmod(os.path.dirname(name), 0o755)
            if os.path.isdir(name) and not os.path.islink(name):
                os.chmod(name, 0o755)
            function(name)
        except OSError:
            pass

    shutil.rmtree(path, onerror=retry)
