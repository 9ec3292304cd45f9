"""Running one action on this machine: stage its declared inputs in a private sandbox,
call the rule (in a worker process when the rule is heavy), check and store its declared
outputs.

``LocalExecutor`` implements the ``_protocols.Executor`` seam: ``submit`` takes an
``Action`` record (plain and picklable: rule reference, attributes, input digests) and
returns a future of its ``Outcome``. A distributed executor takes the same record: it
needs only the store's blobs and the rule's importable module.
"""

from __future__ import annotations

import importlib
import os
import shutil
import signal
import stat
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..api.providers import provider_name, returned_providers
from ..api.rule import ActionContext, Dep
from ..core.errors import QbuildError, RuleError
from ..core.files import SourceDigests, copy_new, hash_file, stat_key
from ..core.labels import OUT_PREFIX, output_folder
from ..core.protocols import Store
from ..core.records import Action, ActionResult, Outcome, OutputEntry
from ..store.keylock import flock_fd

if TYPE_CHECKING:
    import concurrent.futures


class ActionFailed(Exception):
    """The action failed; ``error`` is user-facing, ``log_tail`` the end of its log."""

    def __init__(self, error: QbuildError | str, log_tail: str = "", where: str = "") -> None:
        super().__init__(str(error))
        self.error = error
        self.log_tail = log_tail
        # where it ran ("on worker tcp://..."): shown to the user, never part of the
        # reason a tolerating dependent is given (that reason is in its key)
        self.where = where


class MissingBlob(Exception):
    """A dependency's output blob is missing or corrupt: the dependency must rebuild."""

    def __init__(self, dep_label: str) -> None:
        super().__init__(dep_label)
        self.dep_label = dep_label  # as the action's ``deps`` name it


label_dir = output_folder


def _invoke(rule_ref: str, ctx: ActionContext
            ) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """Import and run a rule; also the entry point of worker processes. Returns (info,
    providers, warnings)."""
    module_name, qualname = rule_ref.split(":", 1)
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    try:
        value = obj().run(ctx)
    except QbuildError as exc:
        raise exc.located(file=ctx.build_file, target=ctx.label) from None
    except BaseException as exc:  # sys.exit() and the like too: the action fails, not qbuild
        import traceback

        ctx.log(traceback.format_exc())
        what = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        if isinstance(exc, SystemExit):
            what = f"the rule called sys.exit({exc.code!r})"
        raise RuleError(what, file=ctx.build_file, target=ctx.label) from None
    out_root = ctx.workdir / OUT_PREFIX / label_dir(ctx.label)
    try:
        info, providers = returned_providers(value, out_root, tuple(obj.provides))
        missing = [p.__qualname__ for p in obj.provides if provider_name(p) not in providers]
        if missing:
            raise RuleError(f"run() did not return the declared provider(s) "
                            f"{', '.join(missing)}")
    except RuleError as exc:
        raise exc.located(file=ctx.build_file, target=ctx.label) from None
    return info or {}, providers, ctx.warnings


def _tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip("\n").splitlines()[-lines:])


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


class LocalExecutor:
    """Runs actions on this machine: light ones in a thread, heavy ones in a pool of
    worker processes. With ``inline``, ``submit`` runs the action in the thread that
    calls it and returns a finished future: the build's rebuilder already gives every
    running action a thread of its own, and a second hand-over per action costs
    scheduling latency on a loaded machine."""

    def __init__(self, store: Store, root: Path, digests: SourceDigests, jobs: int,
                 inline: bool = False) -> None:
        self.store = store
        self.root = root
        self.digests = digests
        self.jobs = jobs
        self.inline = inline
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._threads: concurrent.futures.ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self._trash = _Trash()
        self._forward: tuple[Path, int | None, bool] | None = None  # see forward_dir

    def submit(self, action: Action) -> concurrent.futures.Future[Outcome]:
        """Run ``action`` in one of ``jobs`` threads (heavy rules then in a worker process)."""
        if self.inline:
            import concurrent.futures

            done: concurrent.futures.Future[Outcome] = concurrent.futures.Future()
            try:
                done.set_result(self.execute(action))
            except Exception as exc:  # ActionFailed, MissingBlob, or a bug: the caller's
                done.set_exception(exc)
            return done
        with self._pool_lock:
            if self._threads is None:  # created on the first miss: no-op builds skip it
                import concurrent.futures

                self._threads = concurrent.futures.ThreadPoolExecutor(
                    self.jobs, thread_name_prefix="qbuild-action")
            threads = self._threads
        return threads.submit(self.execute, action)

    def close(self) -> None:
        if self._threads is not None:
            self._threads.shutdown(wait=True)
            self._threads = None
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self._trash.drain()
        forward, self._forward = self._forward, None
        if forward is not None:
            _Trash._delete(*forward)

    def kill(self) -> None:
        """Stop at once: kill worker processes and every process actions started."""
        pool, self._pool = self._pool, None
        threads, self._threads = self._threads, None
        kill_children()
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        if threads is not None:
            threads.shutdown(wait=False, cancel_futures=True)

    def _workers(self) -> concurrent.futures.ProcessPoolExecutor:
        with self._pool_lock:  # one pool, however many actions ask at once
            if self._pool is None:
                self._pool = self._new_pool(self.jobs)
            return self._pool

    @staticmethod
    def _new_pool(workers: int) -> concurrent.futures.ProcessPoolExecutor:
        # Imported here: a no-op build never starts a worker.
        import concurrent.futures
        import multiprocessing

        return concurrent.futures.ProcessPoolExecutor(
            max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
            initializer=_worker_init, initargs=(os.getpid(),))

    def _run_in_worker(self, action: Action, log_path: Path, function: Any, *args: Any
                       ) -> Any:
        from concurrent.futures.process import BrokenProcessPool

        # A worker killed (out of memory) breaks the whole pool and every action in
        # flight on it: each of those runs once more in a worker of its own, so only the
        # action that kills its worker fails.
        pool = self._workers()
        try:
            return pool.submit(function, *args).result()
        except BrokenProcessPool:
            with self._pool_lock:
                if self._pool is pool:
                    self._pool = None
                    pool.shutdown(wait=False, cancel_futures=True)
        alone = self._new_pool(1)
        try:
            return alone.submit(function, *args).result()
        except BrokenProcessPool:
            raise ActionFailed(RuleError("the worker process died (killed or out of memory)",
                                         target=str(action.label)), _tail(log_path)) from None
        finally:
            alone.shutdown(wait=False, cancel_futures=True)

    def execute(self, action: Action) -> Outcome:
        """Run ``action``; raises ActionFailed or MissingBlob. Nothing partial is stored."""
        if action.steps:
            from .actions import execute_steps

            return execute_steps(self, action)
        started = time.monotonic()
        sandbox, lock, lock_file = new_sandbox(self.store.tmp)  # locked while it lives
        log_path = sandbox / "_action.log"  # made by the first log line (opened "a")
        try:
            ctx, staged = self._stage(action, sandbox, log_path)
            try:
                if action.heavy:
                    info, providers, warnings = self._run_in_worker(
                        action, log_path, _invoke, action.rule_ref, ctx)
                else:
                    info, providers, warnings = _invoke(action.rule_ref, ctx)
            except QbuildError as exc:
                raise ActionFailed(exc, _tail(log_path)) from None
            out_root = sandbox / OUT_PREFIX / label_dir(action.label)
            self._check_inputs(action, sandbox, staged)
            outputs = self._collect(action, out_root, log_path, staged=staged)
            for path, (digest, key) in action.sources.items():
                if not self.digests.still(self.root / path, digest, key):
                    raise ActionFailed(RuleError(
                        f"input {path} changed while the action ran; its result was not "
                        "cached. Run the build again.", target=str(action.label)))
            result = ActionResult(tuple(outputs), action.outputs, info, tuple(warnings),
                                  providers=providers)
            return Outcome(result, time.monotonic() - started)
        finally:
            self._trash.put(sandbox, lock, lock_file)

    def _collect(self, action: Action, out_root: Path, log_path: Path,
                 names: tuple[str, ...] | None = None,
                 staged: dict[Path, tuple[str, str]] | None = None) -> list[OutputEntry]:
        """The declared outputs, stored. An output that is a staged input moved into
        place (a ``filegroup``'s source, say: same inode, size and mtime as staged, still
        read-only) is not hashed again: its digest is the one it was staged with."""
        known: dict[tuple[int, int], tuple[str, int, int]] = {}
        for digest, key in (staged or {}).values():
            dev, ino, size, mtime = key.split(":")[:4]
            known[(int(dev), int(ino))] = (digest, int(size), int(mtime))
        entries = []
        for name in action.outputs if names is None else names:
            path = out_root / name.rstrip("/")
            if name.endswith("/"):
                if not path.is_dir() or path.is_symlink():
                    raise ActionFailed(RuleError(f"the rule did not create declared output "
                                                 f"directory '{name}'", target=str(action.label)),
                                       _tail(log_path))
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
                                       _tail(log_path))
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

    def _check_linked(self, action: Action, sandbox: Path, linked: list[Any]) -> None:
        """Fail an action that wrote to an input linked to a cache blob (``_linked``);
        the blob is discarded, so neither this nor any other build is served it."""
        from .linked import modified

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

    def _check_inputs(self, action: Action, sandbox: Path,
                      staged: dict[Path, tuple[str, str]]) -> None:
        """Fail an action whose rule wrote into one of its (read-only) inputs: its outputs
        may come from the edited bytes, not from what the key names."""
        for path, (digest, key) in staged.items():
            try:
                st = os.lstat(path)
            except OSError:
                continue  # moved or deleted inside the sandbox: no harm done
            if stat_key(st) != key and (not path.is_file() or hash_file(path) != digest):
                raise ActionFailed(RuleError(
                    f"the rule modified its input {path.relative_to(sandbox).as_posix()}; "
                    "inputs are read-only: write outputs instead",
                    target=str(action.label)))

    def _stage(self, action: Action, sandbox: Path, log_path: Path
               ) -> tuple[ActionContext, dict[Path, tuple[str, str]]]:
        staged: dict[Path, tuple[str, str]] = {}
        for rel, (digest, key) in action.sources.items():
            dest = sandbox / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            staged[dest] = (digest, self._stage_source(action, rel, key, dest))
        dep_objects: dict[str, Dep] = {}
        for dep_label, dep in action.deps.items():
            base = sandbox / OUT_PREFIX / label_dir(dep_label)
            for entry in dep.outputs:
                dest = base / entry.path
                if not self.store.restore_blob(entry.digest, dest, entry.executable):
                    raise MissingBlob(dep_label)
                staged[dest] = (entry.digest, stat_key(os.lstat(dest)))
            files = [base / name.rstrip("/") for name in dep.declared]
            dep_objects[dep_label] = Dep(dep_label, files, dict(dep.info), base, dep.digests(),
                                         dict(dep.providers), dep.failed)
        out_root = sandbox / OUT_PREFIX / label_dir(action.label)
        outputs = {}
        for name in action.outputs:
            path = out_root / name.rstrip("/")
            if name.endswith("/"):
                path.mkdir(parents=True, exist_ok=True)
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
            outputs[name] = path
        scratch = sandbox / "_scratch"
        scratch.mkdir()
        attrs = {name: _resolve(value, action.attr_types[name], sandbox, dep_objects)
                 for name, value in action.attrs.items()}
        ctx = ActionContext(label=str(action.label), build_file=action.build_file, attrs=attrs,
                            outputs=outputs, scratch=scratch, log_path=log_path,
                            workdir=sandbox, threads=action.threads, hooks=action.hooks)
        return ctx, staged

    def _stage_source(self, action: Action, rel: str, key: str, dest: Path) -> str:
        """Copy a source file into the sandbox, read-only, checking that it is still the
        file whose digest the key holds (same stat before and after the copy)."""
        return stat_key(self.copy_source(action, rel, key, dest))

    def copy_source(self, action: Action, rel: str, key: str, dest: Path) -> os.stat_result:
        """``_stage_source``, returning the copy's stat."""
        path = self.root / rel
        try:
            before, after, copied = copy_new(path, dest)
        except OSError as exc:
            raise ActionFailed(RuleError(f"cannot read input {rel}: {exc.strerror}",
                                         target=str(action.label))) from None
        if stat_key(before) != key or stat_key(after) != key:
            raise ActionFailed(RuleError(f"input {rel} changed while the build ran; its "
                                         "result was not cached. Run the build again.",
                                         target=str(action.label)))
        return copied

    def forward_dir(self) -> Path:
        """A private folder in the store's ``tmp/`` (locked like a sandbox while this
        executor lives, so a killed build's is swept) where forwarded sources are copied
        before they are moved into the store (``_steps._forward``)."""
        with self._pool_lock:
            if self._forward is None:
                path, lock, lock_file = new_sandbox(self.store.tmp)
                self._forward = (path, lock, lock_file)
            return self._forward[0]


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
            self._delete(sandbox, lock, lock_file)

    @staticmethod
    def _delete(sandbox: Path, lock: int | None, lock_file: bool) -> None:
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
            self._delete(sandbox, lock, False)


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


def _resolve(value: Any, kind: str, sandbox: Path, deps: dict[str, Dep]) -> Any:
    if value is None:
        return None
    if kind == "label":
        return deps[value]
    if kind == "label_list":
        return [deps[v] for v in value]
    if kind == "file":
        return deps[value].file if value.startswith("//") else sandbox / value
    if kind == "files":
        out: list[Path] = []
        for item in value:
            out.extend(deps[item].files if item.startswith("//") else [sandbox / item])
        return out
    return value
