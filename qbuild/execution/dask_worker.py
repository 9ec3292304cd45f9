"""The worker side of remote execution: run one action sent by a qbuild client on this
machine, with the remote cache as the only way bytes come in and go out.

Owns: ``run_remote(request)`` (the function a Dask worker runs; it imports nothing from
Dask but ``get_worker``, to send the action's progress to the client as a Dask event on
the request's ``progress_topic``, so any executor that can call a function by reference
could run it), the identity
check that refuses an action when this machine's qbuild, plugin, rule code, declared
environment facts or toolchain pins differ from the client's, and the per-process state
(a local cache under ``QBUILD_WORKER_CACHE_DIR``, one ``LocalExecutor`` per remote cache).

The sandbox, rule call, output checks and heavy-action worker pool are the engine's own
(``LocalExecutor`` over ``Sandboxes``): only where a source file comes from changes (the
remote cache, by the digest the client's key holds, instead of the client's workspace).
Outputs are uploaded before the action entry (``LayeredStore``'s upload order), and the
call returns only after the entry is written, so a worker killed at any point leaves no
entry behind.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ..core import live
from ..core.errors import QbuildError
from ..core.files import stat_key
from ..core.generation import new_fact_generation
from ..core.records import TargetActions
from ..core.versions import __version__, dist_version
from ..keys.code import CodeDigests
from ..store.digests import SourceDigests
from ..store.http import RemoteConfig, RemoteError
from ..store.local import LocalStore
from ..store.remote import LayeredStore
from .failures import ActionFailed, MissingBlob
from .local import LocalExecutor
from .sandbox import Sandboxes, clean_stale_sandboxes

PROTOCOL = 3  # bump when the request or reply changes shape (2: "upload" in "remote";
# 3: the "missing_source" reply)


class SourceMissing(Exception):
    """A source file's blob is not on the cache server (evicted since the client checked
    it): the client sends it again."""

    def __init__(self, rel: str) -> None:
        super().__init__(rel)
        self.rel = rel


class _Unchanging:
    """Source digests for inputs staged from the cache: bytes named by their digest
    cannot change under the action (the engine's re-check after the run always holds)."""

    def still(self, path: Path, expected_digest: str, expected_key: str) -> bool:
        return True


class WorkerSandboxes(Sandboxes):
    """The engine's sandboxes, staging source files from the cache by digest."""

    def __init__(self, store: LayeredStore, jobs: int) -> None:
        super().__init__(store, Path(store.tmp), _Unchanging(), jobs)  # type: ignore[arg-type]
        self.executable: dict[str, set[str]] = {}  # action key -> executable sources

    def stage_source(self, action: TargetActions, rel: str, key: str, dest: Path) -> str:
        digest = action.sources[rel][0]
        executable = rel in self.executable.get(action.key, ())
        if not self.store.restore_blob(digest, dest, executable):
            raise SourceMissing(rel)
        return stat_key(os.lstat(dest))

    def run_in_worker(self, action: TargetActions, log_path: Path, function: Any, *args: Any
                      ) -> Any:
        # A Dask worker is itself the process that isolates actions (its nanny restarts
        # it, the scheduler reschedules what it ran) and, being daemonic, cannot start
        # a pool: heavy actions run in its thread, as light ones do.
        return function(*args)


class WorkerExecutor(LocalExecutor):
    """The engine's executor, in ``WorkerSandboxes``."""

    def __init__(self, store: LayeredStore, jobs: int) -> None:
        sandboxes = WorkerSandboxes(store, jobs)
        super().__init__(store, sandboxes.root, sandboxes.digests, jobs, sandboxes=sandboxes)
        self.executable = sandboxes.executable  # action key -> executable sources


class _State:
    """What one worker process keeps between actions."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.local: LocalStore | None = None
        self.executors: dict[tuple[Any, ...], tuple[LayeredStore, WorkerExecutor]] = {}
        self.digests: SourceDigests | None = None
        self.units: dict[str, str] = {}  # code unit -> digest when first checked

    def cache_dir(self) -> Path:
        chosen = os.environ.get("QBUILD_WORKER_CACHE_DIR")
        if chosen:
            return Path(chosen)
        return Path(tempfile.gettempdir()) / f"qbuild-worker-{os.getuid()}"

    def executor(self, config: RemoteConfig, jobs: int) -> tuple[LayeredStore, WorkerExecutor]:
        ident = (config.url, config.timeout, tuple(sorted(config.headers.items())))
        with self.lock:
            if self.local is None:
                self.local = LocalStore(self.cache_dir())
                self.digests = SourceDigests(self.local)
                clean_stale_sandboxes(self.local.tmp)
            known = self.executors.get(ident)
            if known is not None and known[0].usable:
                return known
            store = LayeredStore(self.local, config)
            store.warn = lambda text: None  # the reply carries the problem instead
            pair = (store, WorkerExecutor(store, jobs))
            self.executors[ident] = pair
            return pair


_STATE = _State()


def _worker_name() -> tuple[str, int]:
    """(address, threads) of the Dask worker running this call; a host name otherwise."""
    try:
        from distributed import get_worker

        worker: Any = get_worker()
        return str(worker.address), int(getattr(worker, "nthreads", 0) or 1)
    except (ImportError, ValueError, AttributeError):
        import socket

        return f"{socket.gethostname()}:{os.getpid()}", os.cpu_count() or 1


_PROGRESS_EVERY = 0.25  # seconds between looks at a running action's progress


class _Progress:
    """While an action runs here, send each new ``ctx.progress`` it reports to the
    client: a Dask event ``{"label", "done", "total"}`` on the request's topic. Nothing
    is sent outside a Dask worker, or when the client named no topic."""

    def __init__(self, label: str, topic: str | None) -> None:
        self.label = label
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        send = _event_sender(topic) if topic else None
        if send is not None:
            self.thread = threading.Thread(target=self._watch, args=(send,),
                                           name="qbuild-progress", daemon=True)

    def __enter__(self) -> _Progress:
        if self.thread is not None:
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join()

    def _watch(self, send: Any) -> None:
        last = None
        while not self.stop.wait(_PROGRESS_EVERY):
            now = live.read(self.label)
            if now is not None and now != last:
                last = now
                try:
                    send({"label": self.label, "done": now[0], "total": now[1]})
                except Exception:  # noqa: BLE001 - progress never fails an action
                    return


def _event_sender(topic: str) -> Any:
    """``send(message)`` logging a Dask event on ``topic`` from this worker, or None."""
    try:
        from distributed import get_worker

        worker: Any = get_worker()
    except (ImportError, ValueError):
        return None
    return lambda message: worker.log_event(topic, message)


def _rule_class(rule_ref: str) -> Any:
    import importlib

    module_name, qualname = rule_ref.split(":", 1)
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def differences(request: dict[str, Any], digests: SourceDigests) -> list[str]:
    """What differs between this process's installation and the client's, as far as
    this action's outputs can tell: one line each, empty when the worker may run it."""
    parts, out = request["parts"], []
    if request.get("protocol") != PROTOCOL:
        return [f"remote-execution protocol {request.get('protocol')} (client) vs "
                f"{PROTOCOL} (worker)"]
    if parts["qbuild_version"] != __version__:
        out.append(f"qbuild {parts['qbuild_version']} (client) vs {__version__} (worker)")
    dist = parts["plugin"]
    # A plugin module registered by hand (not installed) has no distribution version;
    # its code digest below still covers it.
    if dist and not dist.startswith("local:") and dist_version(dist) != parts["plugin_version"]:
        out.append(f"plugin distribution {dist} {parts['plugin_version']} (client) vs "
                   f"{dist_version(dist)} (worker)")
    code = CodeDigests(digests, [dist] if dist and not dist.startswith("local:") else [])
    for unit, digest in sorted(parts["code"].items()):
        # Digested again for every request (through the stat memo: stat calls when
        # unchanged). The code a worker runs is what it imported, so code changed under
        # a running worker is refused rather than believed (restart it after installs).
        mine = code.unit(unit)[0]
        first = _STATE.units.setdefault(unit, mine)
        if first != mine:
            out.append(f"rule code {unit} changed on this worker after it was loaded "
                       "(restart the worker)")
        elif mine != digest:
            out.append(f"rule code {unit} differs (client {digest[:12]}, worker {mine[:12]}; "
                       "see qbuild explain for the files)")
    from ..keys.toolchain import mismatches

    out += [f"toolchain pin: {line}" for line in mismatches(dict(request.get("pins", {})))]
    if out:  # the rule's own facts need its import, which mismatched code may break
        return out
    try:
        from ..keys.parts import target_env

        rule = _rule_class(request["action"].rule_ref)()
        shim: Any = SimpleNamespace(rule=rule, attrs=request["action"].attrs)
        env = target_env(shim)
    except Exception as exc:  # importing the rule here is part of the check
        return [f"rule {request['action'].rule_ref} cannot be loaded "
                f"({type(exc).__name__}: {exc})"]
    want: dict[str, str] = parts["env"]
    for name in sorted(set(want) | set(env)):
        if want.get(name) != env.get(name):
            out.append(f"environment fact {name}: {want.get(name, '<absent>')!r} (client) "
                       f"vs {env.get(name, '<absent>')!r} (worker)")
    return out


def run_remote(request: dict[str, Any]) -> dict[str, Any]:
    """Run one action for a client; always returns a reply dict (never raises for the
    action's own failures, so Dask retries only what a lost worker interrupted).

    Reply ``status``: ``ok`` (outputs in the remote cache, entry written last),
    ``failed`` (the rule failed: ``error``, ``log_tail``), ``missing`` (a dependency's
    blob is not in the remote cache: ``dep``), ``missing_source`` (a source file's blob
    is not: ``source``), ``refused`` (``reason``: what differs), ``error`` (the remote
    cache could not be used: ``error``). A failure before the rule's code ran says
    ``"started": false``.
    """
    started = time.monotonic()
    new_fact_generation()  # no memo the identity check rests on outlives one request
    worker, threads = _worker_name()
    reply: dict[str, Any] = {"worker": worker, "pid": os.getpid()}
    action: TargetActions = request["action"]
    config = RemoteConfig(url=request["remote"]["url"], upload=True,
                          timeout=request["remote"]["timeout"],
                          headers=dict(request["remote"]["headers"]), environ=os.environ)
    try:
        store, executor = _STATE.executor(config, max(1, threads))
        assert _STATE.digests is not None
        problems = differences(request, _STATE.digests)
    except QbuildError as exc:
        return {**reply, "status": "error", "error": str(exc), "started": False}
    if problems:
        return {**reply, "status": "refused", "reason": "; ".join(problems)}
    executor.executable[action.key] = set(request["parts"]["executable_sources"])
    try:
        with _Progress(str(action.label), request.get("progress_topic")):
            outcome = executor.execute(action)
    except ActionFailed as exc:
        return {**reply, "status": "failed", "error": str(exc.error), "log_tail": exc.log_tail,
                "started": exc.started}
    except MissingBlob as exc:
        if not store.usable:
            return {**reply, "status": "error", "error": store.problem, "started": False}
        return {**reply, "status": "missing", "dep": exc.dep_label}
    except SourceMissing as exc:
        if not store.usable:
            return {**reply, "status": "error", "error": store.problem, "started": False}
        return {**reply, "status": "missing_source", "source": exc.rel}
    except (QbuildError, OSError) as exc:
        return {**reply, "status": "error", "error": f"{type(exc).__name__}: {exc}"}
    finally:
        executor.executable.pop(action.key, None)
    result = outcome.result
    store.put_components(action.key, request["parts"])
    try:
        if request["remote"]["upload"]:
            store.publish(action.key, result)  # blobs, metadata, then the entry
        else:
            _send_blobs(store, result)  # a read-only client: no entry on its behalf
    except (RemoteError, OSError) as exc:
        return {**reply, "status": "error",
                "error": f"outputs could not be uploaded to {store.remote.display_url}: "
                         f"{exc}"}
    return {**reply, "status": "ok", "outputs": [e.to_json() for e in result.outputs],
            "info": dict(result.info), "warnings": list(result.warnings),
            "providers": dict(result.providers), "actions": list(outcome.actions),
            "log": result.log.to_json() if result.log is not None else None,
            "seconds": outcome.seconds,
            "code": request["parts"]["code"],
            "worker_seconds": round(time.monotonic() - started, 4)}


def _send_blobs(store: LayeredStore, result: Any) -> None:
    """Upload the output blobs of ``result`` the server lacks, and nothing else: the
    bytes a client configured not to write entries fetches by digest (each download is
    checked against it, so a blob can never mislead a reader)."""
    for entry in result.outputs:
        if store.remote.cas_size(entry.digest) == entry.size:
            continue
        if not store.send_blob(entry.digest, entry.size):
            raise RemoteError("an output blob left the worker's cache (or was damaged) "
                              "before its upload")
