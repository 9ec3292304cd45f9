"""Remote execution on a Dask cluster: the client side of ``--remote_executor``.

Owns: the remote-execution settings (``--remote_executor``, ``--remote_local_fallback``,
``--strategy``; ``QBUILD_REMOTE_EXECUTOR``; ``executor``, ``local_fallback`` and
``strategy`` in ``qbuild.toml``'s ``[remote]``), the choice of where each action runs,
placement by the rule's declared cores and memory (Dask resources ``CPU`` and
``MEMORY``, when the workers advertise them), and turning a worker's reply into the
engine's ``Outcome``/``ActionFailed``/``MissingBlob``.

Data plane: the remote cache. The client sends an action's key, its key components and
the action description (attributes, input digests); before that it makes sure every
input blob is on the cache server (uploading source files it has and the server lacks).
The worker (``_remote_worker``) fetches inputs by digest, runs the rule with the engine's
sandbox, uploads the outputs and the action entry, and returns digests. No artifact byte
passes through the client (unless a requested output must be placed in qbuild-out, or an
action runs here) or the Dask scheduler (no scatter, no byte-valued results).

Faults: a worker lost mid-action is Dask's to reschedule, at most
``distributed.scheduler.allowed-failures`` times (default 3) before the action fails; a
worker whose code differs refuses (the action is sent again, to the other workers); an
action no remaining worker can run (the only one offering its resources was lost) is
cancelled and runs here with the fallback, or fails saying so; an unreachable scheduler,
or a port that does not answer in Dask's protocol, is one error (exit 2) within the
connect timeout, or local execution with the fallback. An input blob the server lost
between the client's check and the worker's fetch (evicted) is checked and sent again,
twice at most; a cache server failing (here, or on the worker: errors, wrong bytes)
fails the action in one line, or with the fallback runs it here, and once this client
has given up on the server every remote action of the build runs here.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import threading
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import CancelledError
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core import live
from ..core.errors import ConfigError, RuleError, UsageError
from ..core.labels import Label
from ..core.records import ActionResult, KeyParts, Outcome, OutputEntry, TargetActions
from ..core.toml import load_toml
from .failures import ActionFailed, MissingBlob
from .local import LocalExecutor

if TYPE_CHECKING:
    from ..store.remote import LayeredStore

STRATEGIES = ("remote", "local")
_MAX_REFUSALS = 8  # different workers asked before an action gives up
_MAX_RESENDS = 2  # sends again of an action whose input left the server meanwhile
_CHECK_EVERY = 2.0  # seconds between checks that a worker able to run a task is left


@dataclass
class RemoteExecution:
    """Where the scheduler is and which actions go there."""

    address: str  # tcp://host:port (Dask's form of dask://host:port)
    shown: str  # as the user wrote it, for messages
    local_fallback: bool = False
    strategy: dict[str, str] = field(default_factory=dict)  # rule kind (or "*") -> where
    connect_timeout: float = 10.0

    def where(self, kind: str, heavy: bool) -> str:
        """``remote`` or ``local`` for an action of ``kind``. Unlisted kinds: heavy
        rules remote, light ones (file groups, text, commands) local, like Bazel's
        ``--strategy`` defaults keeping cheap actions off the cluster."""
        if kind in self.strategy:
            return self.strategy[kind]
        if "*" in self.strategy:
            return self.strategy["*"]
        return "remote" if heavy else "local"


def _address(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    mapping = {"dask": "tcp", "tcp": "tcp", "dask+tls": "tls", "tls": "tls"}
    host, _, port = rest.rpartition(":")
    if not sep or scheme not in mapping or not host or not port.isdigit() or "/" in rest:
        raise UsageError(f"bad --remote_executor {url!r}: write dask://host:port (the Dask "
                         "scheduler's address; dask+tls://host:port for TLS)")
    return f"{mapping[scheme]}://{rest}"


def parse_strategy(items: list[str], where: str) -> dict[str, str]:
    out = {}
    for item in items:
        kind, sep, value = item.partition("=")
        if not sep or not kind.strip() or value.strip() not in STRATEGIES:
            raise UsageError(f"bad {where} {item!r}: write KIND=remote or KIND=local "
                             "(KIND * for every kind not listed)")
        out[kind.strip()] = value.strip()
    return out


def resolve_executor(root: Path, flags: Mapping[str, Any] | None = None,
                     environ: Mapping[str, str] | None = None) -> RemoteExecution | None:
    """The remote-execution settings of a build, or None to run everything here.

    ``flags``: ``executor`` (URL; empty turns a configured one off), ``local_fallback``
    (None: not given) and ``strategy`` (``KIND=remote|local`` items)."""
    flags = dict(flags or {})
    environ = os.environ if environ is None else environ
    marker = root / "qbuild.toml"
    table = load_toml(marker).get("remote", {})
    if not isinstance(table, dict):
        raise ConfigError("[remote] must be a table", file=marker)
    url = flags.get("executor")
    if url is None:
        url = environ.get("QBUILD_REMOTE_EXECUTOR")
    if url is None:
        url = table.get("executor")
        if url is not None and not isinstance(url, str):
            raise ConfigError("[remote] 'executor' must be a dask://host:port string",
                              file=marker)
    if not url:
        return None
    fallback = flags.get("local_fallback")
    if fallback is None:
        fallback = table.get("local_fallback", False)
        if not isinstance(fallback, bool):
            raise ConfigError("[remote] 'local_fallback' must be true or false", file=marker)
    strategy = table.get("strategy", {})
    if not isinstance(strategy, dict) or not all(
            isinstance(v, str) and v in STRATEGIES for v in strategy.values()):
        raise ConfigError("[remote] 'strategy' must map rule kinds to \"remote\" or "
                          "\"local\"", file=marker)
    strategy = dict(strategy)
    strategy.update(parse_strategy(list(flags.get("strategy") or []), "--strategy"))
    return RemoteExecution(address=_address(url), shown=url, local_fallback=bool(fallback),
                           strategy=strategy)


class _Slots:
    """Cores for actions that run on this machine while the build's own limits are the
    cluster's (the engine's scheduler then admits as many actions as the cluster has)."""

    def __init__(self, cores: int) -> None:
        self.free = self.total = max(1, cores)
        self.cond = threading.Condition()

    def take(self, n: int) -> int:
        n = max(1, min(n, self.total))
        with self.cond:
            self.cond.wait_for(lambda: self.free >= n)
            self.free -= n
        return n

    def give(self, n: int) -> None:
        with self.cond:
            self.free += n
            self.cond.notify_all()


class DaskExecutor:
    """An executor sending actions to a Dask cluster; the rest run on ``local``."""

    def __init__(self, local: LocalExecutor, store: Any, settings: RemoteExecution,
                 pins: Mapping[str, str], local_cores: int,
                 message: Callable[[str], None], verbose: bool = False) -> None:
        self.local = local
        self.store: LayeredStore = store  # the remote cache is required
        self.parts: Mapping[Label, KeyParts] = {}  # each action's key parts (the build's)
        self.settings = settings
        self.pins = dict(pins)
        self.message = message
        self.verbose = verbose
        self.slots = _Slots(local_cores)
        self.client: Any = None
        self.resources: dict[str, float] = {}  # largest of each resource a worker offers
        self.threads = 0  # worker threads in the cluster at connect time
        self.refused: dict[str, str] = {}  # worker -> what differs
        self.ran_on: dict[str, int] = {}  # worker -> actions it ran
        self.ran_here = 0
        self.fell_back = ""  # why remote actions run here, once the cluster is gone
        self._present: set[str] = set()  # digests known to be on the cache server
        self._cache_warned = False
        self._lock = threading.Lock()
        self._futures: set[Any] = set()
        self._workers_seen: tuple[float, dict[str, Any]] = (float("-inf"), {})
        self._threads: concurrent.futures.ThreadPoolExecutor | None = None
        # Workers send a running action's ctx.progress as Dask events on this client's
        # own topic; shown on the live line while the action is in flight (_remote).
        self._progress_topic = f"qbuild-progress-{uuid.uuid4().hex}"
        self._in_flight: set[str] = set()
        self._connect()

    # -- the cluster ----------------------------------------------------------------------
    def _connect(self) -> None:
        try:
            from distributed import Client
        except ImportError:
            raise UsageError("--remote_executor needs Dask's distributed package: "
                             "pip install 'qbuild[dask]'") from None
        # Dask logs its reconnection attempts with tracebacks; the build reports a lost
        # scheduler in one line instead (--verbose keeps Dask's own logs).
        self._dask_levels: dict[str, int] = {}
        if not self.verbose:
            names = ["distributed", *(n for n in logging.root.manager.loggerDict
                                      if n.startswith("distributed."))]
            for name in names:  # Dask's configuration sets levels on child loggers
                self._dask_levels[name] = logging.getLogger(name).level
                logging.getLogger(name).setLevel(logging.CRITICAL)
        try:
            # --remote_timeout bounds the wait too (Dask retries a refused connection).
            timeout = min(self.settings.connect_timeout, self.store.remote_config.timeout)
            self.client = _client_within(Client, self.settings.address, timeout)
            info = self._info()
        except (OSError, TimeoutError) as exc:
            self.client = None
            why = f"cannot reach the Dask scheduler at {self.settings.shown} ({_short(exc)})"
            if not self.settings.local_fallback:
                raise UsageError(f"{why}; start it, fix --remote_executor, or pass "
                                 "--remote_local_fallback to build here") from None
            self.fell_back = why
            self.message(f"WARNING: {why}; --remote_local_fallback: building here")
            return
        try:
            self.client.subscribe_topic(self._progress_topic, self._progress)
        except Exception:  # noqa: BLE001 - progress is a courtesy: builds go on without it
            pass
        workers = info.get("workers", {})
        self.threads = sum(int(w.get("nthreads", 0)) for w in workers.values())
        for worker in workers.values():
            for name, amount in (worker.get("resources") or {}).items():
                self.resources[name] = max(self.resources.get(name, 0), float(amount))
        link = ""
        try:
            link = f", dashboard {self.client.dashboard_link}"
        except (KeyError, AttributeError, ValueError):
            pass
        self.message(f"remote execution on {self.settings.shown}: {len(workers)} workers, "
                     f"{self.threads} threads{link}")

    def _info(self) -> dict[str, Any]:
        """The scheduler's description of every worker (some releases list 5 unless
        asked for all)."""
        try:
            return dict(self.client.scheduler_info(n_workers=-1))
        except TypeError:
            return dict(self.client.scheduler_info())

    def _progress(self, event: Any) -> None:
        """A worker's ``(timestamp, {"label", "done", "total"})`` event (called on the
        client's event loop): shown while that label's action is in flight."""
        try:
            message = event[1]
            label, done, total = str(message["label"]), int(message["done"]), \
                int(message["total"])
        except (TypeError, KeyError, IndexError, ValueError):
            return
        with self._lock:  # (a late event for an action that ended is dropped)
            if label in self._in_flight:
                live.report(label, done, total)

    def submit(self, action: TargetActions) -> concurrent.futures.Future[Outcome]:
        """Run ``action`` on the cluster or here, from a thread of this executor's (one
        per action in flight: each waits on the scheduler or on this machine's cores)."""
        with self._lock:
            if self._threads is None:
                self._threads = concurrent.futures.ThreadPoolExecutor(
                    256, thread_name_prefix="qbuild-remote")
            threads = self._threads
        return threads.submit(self.execute, action)

    def close(self) -> None:
        if self._threads is not None:
            self._threads.shutdown(wait=True)
            self._threads = None
        self.local.close()
        if self.client is not None:
            client, self.client = self.client, None
            client.close()
        for name, level in self._dask_levels.items():
            logging.getLogger(name).setLevel(level)

    def kill(self) -> None:
        self.local.kill()
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            futures = list(self._futures)
        if self.client is not None and futures:
            try:
                self.client.cancel(futures)
            except Exception:  # noqa: BLE001 - best effort on Ctrl-C
                pass

    def summary(self) -> dict[str, Any]:
        return {"scheduler": self.settings.shown, "workers": dict(sorted(self.ran_on.items())),
                "remote_actions": sum(self.ran_on.values()), "local_actions": self.ran_here,
                "refused": dict(self.refused), "fallback": self.fell_back}

    # -- one action -----------------------------------------------------------------------
    def execute(self, action: TargetActions) -> Outcome:
        parts = self.parts.get(action.label)
        if parts is None or self.client is None:
            return self._here(action)
        if self.settings.where(str(parts.get("rule", "")), action.heavy) == "local":
            return self._here(action)
        if not self.store.usable and self.settings.local_fallback:
            # The cache, the cluster's data plane, was given up on in this build: what a
            # worker makes could not be fetched (nor its inputs checked) from here.
            return self._here(action)
        try:
            action, resources = self._placement(action)
        except ActionFailed:
            if not self.settings.local_fallback:
                raise
            return self._here(action)
        label = str(action.label)
        with self._lock:
            self._in_flight.add(label)
        try:
            return self._remote(action, parts, resources)
        finally:
            with self._lock:
                self._in_flight.discard(label)
                live.forget(label)

    def _remote(self, action: TargetActions, parts: KeyParts, resources: dict[str, float]
                ) -> Outcome:
        """Run ``action`` on the cluster (asking other workers when one refuses), or here
        once the cluster is gone and the fallback allows it."""
        excluded: set[str] = set()
        resent = 0
        while True:
            try:
                self._ensure_inputs(action)
            except _CacheTrouble as exc:
                return self._cache_failed(action, str(exc))
            reply = self._submit(action, parts, resources, excluded)
            if reply is None:  # the cluster went away; fallback chosen
                return self._here(action)
            status = reply["status"]
            if status == "refused":
                if self._refusal(action, reply, excluded):
                    continue
                return self._all_refused(action, excluded)
            if status in ("missing", "missing_source") and resent < _MAX_RESENDS:
                # Evicted from the server since it was checked: check and send again.
                resent += 1
                self._forget(action)
                continue
            if status in ("missing_source", "error") and self.settings.local_fallback:
                return self._cache_failed(action, _worker_trouble(reply))
            return self._accept(action, parts, reply)

    def _refusal(self, action: TargetActions, reply: dict[str, Any], excluded: set[str]) -> bool:
        """Note a worker's refusal; True if other workers are left to ask."""
        with self._lock:
            first = reply["worker"] not in self.refused
            self.refused[reply["worker"]] = reply["reason"]
        if first:
            self.message(f"WARNING: worker {reply['worker']} refused {action.label}: "
                         f"{reply['reason']}")
        excluded.add(reply["worker"])
        return len(excluded) < _MAX_REFUSALS and bool(self._others(excluded))

    def _all_refused(self, action: TargetActions, excluded: set[str]) -> Outcome:
        if self.settings.local_fallback:
            return self._here(action)
        reasons = "; ".join(f"{w}: {r}" for w, r in sorted(self.refused.items())
                            if w in excluded)
        raise ActionFailed(RuleError(f"every Dask worker refused the action because its "
                                     f"installation differs from this client's ({reasons}); "
                                     "install the same lock on the workers",
                                     target=str(action.label)), started=False)

    def _cache_failed(self, action: TargetActions, why: str) -> Outcome:
        """The remote cache failed the action's inputs (here or on its worker): it runs
        here with the fallback (one warning per build), else it fails saying why."""
        if not self.settings.local_fallback:
            raise ActionFailed(RuleError(why, target=str(action.label)), started=False)
        with self._lock:
            first, self._cache_warned = not self._cache_warned, True
        if first:
            self.message(f"WARNING: {action.label}: {why}; --remote_local_fallback: building "
                         "it here (and any other action the cache fails)")
        return self._here(action)

    def _forget(self, action: TargetActions) -> None:
        """Check the action's inputs on the server again before the next send."""
        digests = {digest for digest, _key in action.sources.values()}
        for dep in action.deps.values():
            digests.update(e.digest for e in dep.outputs)
        with self._lock:
            self._present -= digests

    def _here(self, action: TargetActions) -> Outcome:
        taken = self.slots.take(action.threads)
        try:
            outcome = self.local.execute(
                replace(action, threads=min(action.threads, self.slots.total)))
        finally:
            self.slots.give(taken)
        with self._lock:
            self.ran_here += 1
        return outcome

    def _others(self, excluded: set[str]) -> list[str]:
        try:
            workers = list(self._info().get("workers", {}))
        except (OSError, TimeoutError):
            return []
        return [w for w in workers if w not in excluded]

    def _placement(self, action: TargetActions) -> tuple[TargetActions, dict[str, float]]:
        """Dask resources for the action's declared cores and memory, for the resource
        names the cluster's workers advertise (none: Dask's one task per thread), plus
        its accelerators (``{"GPU": 1}``, which some worker must offer), and the action
        with the cores it is granted."""
        out: dict[str, float] = {}
        cores, mib = action.threads, action.memory_mib
        if "CPU" in self.resources:
            # As here: a rule asking for more cores than a machine has gets them all.
            out["CPU"] = float(min(max(1, cores), self.resources["CPU"]))
            action = replace(action, threads=int(out["CPU"]))
        if "MEMORY" in self.resources and mib > 0:
            if mib > self.resources["MEMORY"]:
                raise ActionFailed(RuleError(
                    f"needs {mib} MiB of memory; the largest Dask worker offers MEMORY="
                    f"{self.resources['MEMORY']:g} (start workers with more, or pass "
                    "--remote_local_fallback to run it here)", target=str(action.label)),
                    started=False)
            out["MEMORY"] = float(mib)
        for name, amount in sorted(action.accelerators.items()):
            if amount <= 0:
                continue
            offered = self.resources.get(name, 0.0)
            if amount > offered:
                has = (f"the largest Dask worker offers {name}={offered:g}" if offered
                       else f"no Dask worker offers {name}")
                raise ActionFailed(RuleError(
                    f"needs {name}={amount:g}; {has} (start a worker with --resources "
                    f"\"{name}={amount:g}\", or pass --remote_local_fallback to run it "
                    "here)", target=str(action.label)), started=False)
            out[name] = float(amount)
        return action, out

    def _ensure_inputs(self, action: TargetActions) -> None:
        """Every input blob on the cache server before the action is sent: sources from
        the workspace (copied and hashed first: only bytes matching the key's digest are
        sent), dependency outputs from the local cache when the server lacks them."""
        remote = self.store.remote
        wanted: list[tuple[str, str | None, str]] = [
            (digest, rel, "") for rel, (digest, _key) in action.sources.items()]
        for label, dep in action.deps.items():
            wanted += [(e.digest, None, label) for e in dep.outputs]
        for digest, rel, label in wanted:
            with self._lock:
                if digest in self._present:
                    continue
            try:
                if remote.cas_size(digest) is None:
                    if rel is not None:
                        self._upload_source(action, rel, digest)
                    elif not self.store.send_blob(digest):  # gone or damaged here
                        raise MissingBlob(label)
            except (OSError, _remote_error()) as exc:
                raise _CacheTrouble(f"cannot send the inputs of the action to the remote "
                                    f"cache ({_short(exc)})") from None
            with self._lock:
                self._present.add(digest)

    def _upload_source(self, action: TargetActions, rel: str, digest: str) -> None:
        from ..core.files import copy_hashing

        temp = self.store.tmp / f"{os.getpid()}-src-{uuid.uuid4().hex[:12]}"
        try:
            if copy_hashing(self.local.root / rel, temp) != digest:
                raise ActionFailed(RuleError(f"input {rel} changed while the build ran; run "
                                             "the build again", target=str(action.label)),
                                   started=False)
            self.store.remote.put_cas(digest, temp, temp.stat().st_size)
        finally:
            temp.unlink(missing_ok=True)

    def _request(self, action: TargetActions, parts: KeyParts) -> dict[str, Any]:
        from .dask_worker import PROTOCOL

        config = self.store.remote_config
        return {"protocol": PROTOCOL, "action": action, "parts": parts,
                "pins": self.pins, "progress_topic": self._progress_topic,
                "remote": {"url": config.url, "timeout": config.timeout,
                           "headers": dict(config.headers), "upload": config.upload}}

    def _submit(self, action: TargetActions, parts: KeyParts, resources: dict[str, float],
                excluded: set[str]) -> dict[str, Any] | None:
        from distributed import KilledWorker

        from .dask_worker import run_remote

        kwargs: dict[str, Any] = {}
        if excluded:
            kwargs["workers"] = self._others(excluded)
            kwargs["allow_other_workers"] = False
        key = f"qbuild-{action.label}-{action.key[:12]}-{uuid.uuid4().hex[:8]}"
        try:
            future = self.client.submit(run_remote, self._request(action, parts), key=key,
                                        pure=False, resources=resources or None, **kwargs)
            with self._lock:
                self._futures.add(future)
            try:
                reply: dict[str, Any] | None = self._wait(future, resources,
                                                          kwargs.get("workers"))
            finally:
                with self._lock:
                    self._futures.discard(future)
            if reply is not None:
                return reply
            needs = ", ".join(f"{n}={a:g}" for n, a in sorted(resources.items()))
            why = "no Dask worker able to run it is left" + (f" (it needs {needs})"
                                                            if needs else "")
            if not self.settings.local_fallback:
                raise ActionFailed(RuleError(f"{why}; start one, or pass "
                                             "--remote_local_fallback to run it here",
                                             target=str(action.label)), started=False)
            self.message(f"WARNING: {action.label}: {why}; --remote_local_fallback: "
                         "building it here")
            return None
        except KilledWorker as exc:
            raise ActionFailed(RuleError(
                f"the Dask workers running it died every time it was tried ({_short(exc)}); "
                "the action may take more memory than a worker has", target=str(action.label))
            ) from None
        except (OSError, TimeoutError, CancelledError) as exc:  # scheduler lost
            if self.client is None or not self.settings.local_fallback:
                raise ActionFailed(RuleError(f"the Dask scheduler {self.settings.shown} was "
                                             f"lost ({_short(exc)})",
                                             target=str(action.label))
                                   ) from None
            with self._lock:
                if not self.fell_back:
                    self.fell_back = f"the Dask scheduler was lost ({_short(exc)})"
                    self.message(f"WARNING: {self.fell_back}; --remote_local_fallback: "
                                 "building the rest here")
            return None
        except Exception as exc:  # noqa: BLE001 - raised by run_remote itself: a bug
            raise ActionFailed(RuleError(f"internal error on a Dask worker: {_short(exc)} "
                                         "(report it)", target=str(action.label))) from None

    def _wait(self, future: Any, resources: Mapping[str, float],
              restricted: list[str] | None) -> dict[str, Any] | None:
        """The reply of ``future``; None (the task cancelled) once no worker that could
        run it is left: Dask would keep it waiting for one to join. Checked every few
        seconds, twice in a row (a worker restarted by its nanny is back by then)."""
        unable = 0
        while True:
            try:
                reply: dict[str, Any] = future.result(timeout=_CHECK_EVERY)
                return reply
            except TimeoutError:
                if future.done():
                    raise  # (the scheduler's own timeout: handled by the caller)
            if self._able(resources, restricted):
                unable = 0
                continue
            unable += 1
            if unable >= 2:
                future.cancel()
                return None

    def _able(self, resources: Mapping[str, float], restricted: list[str] | None) -> bool:
        """Is some worker left that may run a task needing ``resources``?"""
        import time

        with self._lock:  # one scheduler query per check period for all waiting actions
            asked, workers = self._workers_seen
        if time.monotonic() - asked >= _CHECK_EVERY:
            try:
                workers = dict(self._info().get("workers", {}))
            except (OSError, TimeoutError):
                return True  # the scheduler itself is gone: reported when the task fails
            with self._lock:
                self._workers_seen = (time.monotonic(), workers)
        for address, worker in workers.items():
            if restricted is not None and address not in restricted:
                continue
            offered = worker.get("resources") or {}
            if all(float(offered.get(n, 0)) >= a for n, a in resources.items()):
                return True
        return False

    def _accept(self, action: TargetActions, parts: KeyParts, reply: dict[str, Any]) -> Outcome:
        status = reply["status"]
        if status == "missing":
            raise MissingBlob(reply["dep"])
        if status == "missing_source":
            raise ActionFailed(RuleError(f"input {reply['source']} left the remote cache "
                                         f"each of the {1 + _MAX_RESENDS} times it was sent "
                                         "(is the server evicting that fast?); pass "
                                         "--remote_local_fallback to build such actions here",
                                         target=str(action.label)), started=False)
        if status == "failed":
            raise ActionFailed(reply["error"], reply.get("log_tail", ""),
                               where=f"on worker {reply['worker']}",
                               started=reply.get("started", True) is not False)
        if status == "error":
            raise ActionFailed(RuleError(_worker_trouble(reply), target=str(action.label)),
                               started=False)
        if status != "ok":
            raise ActionFailed(RuleError(f"worker {reply['worker']}: {reply.get('error')}",
                                         target=str(action.label)),
                               started=reply.get("started", True) is not False)
        if reply.get("code") != parts.get("code"):
            raise ActionFailed(RuleError(f"worker {reply['worker']} answered for other rule "
                                         "code; its result is not used",
                                         target=str(action.label)))
        outputs = tuple(OutputEntry.from_json(e) for e in reply["outputs"])
        with self._lock:
            self.ran_on[reply["worker"]] = self.ran_on.get(reply["worker"], 0) + 1
            self._present.update(e.digest for e in outputs)
        # origin "remote": the worker wrote the entry; the store keeps it locally only.
        result = ActionResult(outputs, action.outputs, dict(reply["info"]),
                              tuple(str(w) for w in reply["warnings"]), origin="remote",
                              providers=dict(reply.get("providers") or {}),
                              log=OutputEntry.from_json(reply["log"]) if reply.get("log")
                              else None)
        steps = tuple((str(a), str(b), str(c)) for a, b, c in reply.get("actions") or ())
        return Outcome(result, float(reply["seconds"]), worker=str(reply["worker"]),
                       actions=steps)


def _client_within(client_class: Any, address: str, timeout: float) -> Any:
    """A connected Dask client, or TimeoutError after ``timeout`` seconds: Dask's own
    ``timeout`` bounds reaching the port, not its handshake, which waits forever on a
    port that accepts TCP and never answers in Dask's protocol (an HTTP dashboard)."""
    made: dict[str, Any] = {}

    def connect() -> None:
        try:
            made["client"] = client_class(address, timeout=timeout, set_as_default=False)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            made["error"] = exc

    # A daemon thread: one stuck in a handshake is abandoned, never waited for at exit.
    thread = threading.Thread(target=connect, name="qbuild-dask-connect", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(f"no answer in Dask's protocol within {timeout:g} s; is it the "
                           "scheduler's port, not its dashboard's?")
    if "error" in made:
        raise made["error"]
    return made["client"]


class _CacheTrouble(Exception):
    """The cache server failed while the client sent an action's inputs."""


def _worker_trouble(reply: dict[str, Any]) -> str:
    if reply["status"] == "missing_source":
        return (f"input {reply['source']} kept leaving the remote cache before worker "
                f"{reply['worker']} could fetch it")
    return f"worker {reply['worker']} could not use the remote cache ({reply.get('error')})"


def _remote_error() -> type[Exception]:
    from ..store.http import RemoteError

    return RemoteError


def _short(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
