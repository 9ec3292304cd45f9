"""Running one action on this machine: stage its declared inputs in a private sandbox,
call the rule (in a worker process when the rule is heavy), check and store its declared
outputs.

``LocalExecutor`` implements the ``_protocols.Executor`` seam: ``submit`` takes an
``Action`` record (plain and picklable: rule reference, attributes, input digests) and
returns a future of its ``Outcome``. A distributed executor takes the same record: it
needs only the store's blobs and the rule's importable module.

Owns: the threads actions run in, and what a v1 rule's action is (its inputs staged under
``qbuild-out/`` paths in the sandbox, ``rule.run(ctx)``). A v2 target's declared actions
are ``actions.execute_steps``'s; sandbox folders, worker processes, and moving files
between a sandbox and the store are ``sandbox.Sandboxes``'s, which both use.
"""

from __future__ import annotations

import importlib
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..api.providers import provider_name, returned_providers
from ..api.rule import ActionContext, Dep
from ..core.errors import QbuildError, RuleError
from ..core.files import SourceDigests, stat_key
from ..core.labels import OUT_PREFIX, output_folder
from ..core.protocols import Store
from ..core.records import Action, ActionResult, Outcome
from .actions import execute_steps
from .failures import ActionFailed, MissingBlob, log_tail
from .sandbox import Sandboxes

if TYPE_CHECKING:
    import concurrent.futures


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


class LocalExecutor:
    """Runs actions on this machine: light ones in a thread, heavy ones in a pool of
    worker processes, each in a sandbox of its own (``sandboxes``; a ``Sandboxes`` over
    the store, ``root`` and ``digests`` unless given). With ``inline``, ``submit`` runs
    the action in the thread that calls it and returns a finished future: the build's
    rebuilder already gives every running action a thread of its own, and a second
    hand-over per action costs scheduling latency on a loaded machine."""

    def __init__(self, store: Store, root: Path, digests: SourceDigests, jobs: int,
                 inline: bool = False, sandboxes: Sandboxes | None = None) -> None:
        self.store = store
        self.root = root
        self.digests = digests
        self.jobs = jobs
        self.inline = inline
        self.sandboxes = sandboxes if sandboxes is not None else Sandboxes(
            store, root, digests, jobs)
        self._threads: concurrent.futures.ThreadPoolExecutor | None = None
        self._threads_lock = threading.Lock()

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
        with self._threads_lock:
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
        self.sandboxes.shutdown()

    def kill(self) -> None:
        """Stop at once: kill worker processes and every process actions started."""
        threads, self._threads = self._threads, None
        self.sandboxes.kill()
        if threads is not None:
            threads.shutdown(wait=False, cancel_futures=True)

    def execute(self, action: Action) -> Outcome:
        """Run ``action``; raises ActionFailed or MissingBlob. Nothing partial is stored."""
        if action.steps:
            return execute_steps(self.sandboxes, action)
        started = time.monotonic()
        box = self.sandboxes.open(reuse=False)  # locked while it lives
        sandbox = box.path
        log_path = sandbox / "_action.log"  # made by the first log line (opened "a")
        try:
            ctx, staged = self._stage(action, sandbox, log_path)
            try:
                if action.heavy:
                    info, providers, warnings = self.sandboxes.run_in_worker(
                        action, log_path, _invoke, action.rule_ref, ctx)
                else:
                    info, providers, warnings = _invoke(action.rule_ref, ctx)
            except QbuildError as exc:
                raise ActionFailed(exc, log_tail(log_path)) from None
            out_root = sandbox / OUT_PREFIX / label_dir(action.label)
            self.sandboxes.check_staged_inputs(action, sandbox, staged)
            outputs = self.sandboxes.collect_outputs(action, out_root, log_path,
                                                     staged=staged)
            self.sandboxes.check_sources(action)
            result = ActionResult(tuple(outputs), action.outputs, info, tuple(warnings),
                                  providers=providers)
            return Outcome(result, time.monotonic() - started)
        finally:
            self.sandboxes.discard(box)

    def _stage(self, action: Action, sandbox: Path, log_path: Path
               ) -> tuple[ActionContext, dict[Path, tuple[str, str]]]:
        staged: dict[Path, tuple[str, str]] = {}
        for rel, (digest, key) in action.sources.items():
            dest = sandbox / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            staged[dest] = (digest, self.sandboxes.stage_source(action, rel, key, dest))
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
