"""Test helpers for plugin authors (and for qbuild's own built-in plugins).

Loaded automatically as a pytest plugin (entry point ``pytest11``)::

    def test_my_rule(qbuild_workspace):
        ws = qbuild_workspace
        ws.write("models/BUILD.toml", '''
            [small]
            rule = "my_rule"
            size = 3
        ''')
        result = ws.build("//models:small")
        assert result.ok, result.error
        assert result.ran == ["//models:small"]
        assert ws.build("//models:small").ran == []      # second build: all cached

``ws.build`` runs the real engine in-process (with the real executor, store and worker
processes) against a private workspace and cache; ``ws.cli`` runs the real ``qbuild``
command in a subprocess.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pytest

from .core.errors import QbuildError

if TYPE_CHECKING:
    import concurrent.futures

    from .core.records import Outcome, TargetActions

__all__ = ["BuildOutcome", "CliOutcome", "FakeExecutor", "Workspace", "qbuild_workspace"]


def _options_digest(plugins: Iterable[Any], *settings: Any) -> str:
    """What the command line's options digest holds for an in-process build: the
    plugins registered by hand and the settings given as arguments (hashed, so no
    header value is written down)."""
    import hashlib
    import json

    names = [getattr(p, "__name__", None) or type(p).__qualname__ for p in plugins]
    return hashlib.sha256(json.dumps([names, *settings], default=str).encode()).hexdigest()


@dataclass
class BuildOutcome:
    """What one ``Workspace.build`` did."""

    ok: bool
    exit_code: int
    ran: list[str] = field(default_factory=list)
    cached: list[str] = field(default_factory=list)
    remote_hits: list[str] = field(default_factory=list)
    remote: dict[str, Any] | None = None
    remote_execution: dict[str, Any] | None = None  # per-worker counts, refusals, fallback
    failed: dict[str, str] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    tolerated: dict[str, str] = field(default_factory=dict)
    """Failed or skipped targets whose dependents tolerate it (the build is still ok)."""
    error: str = ""
    log: str = ""
    bytes_hashed: int = 0
    explanations: dict[str, list[str]] = field(default_factory=dict)
    actions: dict[str, dict[str, str]] = field(default_factory=dict)
    """Targets whose target key missed: each of their declared actions (by mnemonic),
    "ran" or "cached"."""
    _outputs: dict[str, list[Path]] = field(default_factory=dict)
    _infos: dict[str, dict[str, Any]] = field(default_factory=dict)
    _providers: dict[str, dict[str, Any]] = field(default_factory=dict)
    _output_dir: Path | None = None

    @property
    def steps(self) -> dict[str, dict[str, str]]:
        """The name of ``actions`` before 0.2 (the engine called a target's actions its
        steps); kept for tests written then."""
        return self.actions

    def outputs(self, label: str) -> list[Path]:
        """Paths of a requested target's outputs under the workspace's qbuild-out."""
        return self._outputs[label]

    def output(self, label: str) -> Path:
        """The single output of a requested target."""
        (path,) = self._outputs[label]
        return path

    def info(self, label: str) -> dict[str, Any]:
        """The info the target's rule returned (also for cached actions)."""
        return self._infos[label]

    def provider(self, label: str, cls: type) -> Any:
        """A requested target's provider ``cls``, typed, its paths in qbuild-out
        (``KeyError`` if the target does not give it)."""
        from .api.providers import decode, provider_name

        data = self._providers.get(label, {}).get(provider_name(cls))
        if data is None:
            raise KeyError(f"{label} gives no {cls.__qualname__}")
        from .core.labels import output_folder

        root = self._output_dir / output_folder(label) if self._output_dir else None
        return decode(cls, data, root)


@dataclass
class CliOutcome:
    code: int
    stdout: str
    stderr: str


class Workspace:
    """A temporary qbuild workspace with its own cache directory."""

    def __init__(self, root: Path, cache_dir: Path) -> None:
        self.root = root
        self.cache_dir = cache_dir
        self.plugins: list[ModuleType | Any] = []
        root.mkdir(parents=True, exist_ok=True)
        self.write("qbuild.toml", f'[settings]\ncache_dir = "{cache_dir.as_posix()}"\n')

    @classmethod
    def existing(cls, root: Path, plugins: list[ModuleType | Any] | None = None) -> Workspace:
        """A handle on a workspace that already exists (its qbuild.toml is kept as is)."""
        from .analysis.workspace import load_workspace

        workspace = cls.__new__(cls)
        workspace.root = Path(root)
        workspace.cache_dir = load_workspace(workspace.root).cache_dir
        workspace.plugins = list(plugins or [])
        return workspace

    def path(self, rel: str) -> Path:
        return self.root / rel

    def write(self, rel: str, text: str) -> Path:
        """Write a text file (dedented) relative to the workspace root."""
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
        return path

    def write_bytes(self, rel: str, data: bytes) -> Path:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return path

    def copy(self, source: str | os.PathLike[str], rel: str) -> Path:
        """Copy a file into the workspace."""
        dest = self.root / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, dest)
        return dest

    def register(self, plugin: ModuleType | Any) -> None:
        """Use a plugin module that is not installed through an entry point."""
        self.plugins.append(plugin)

    def build(self, *patterns: str, jobs: int = 2, keep_going: bool = False,
              explain: bool = False, cwd: str = "", cpu: int | None = None,
              memory: int | None = None, remote_cache: str | None = None,
              remote_upload: bool | None = None, remote_timeout: float | None = None,
              remote_headers: list[str] | None = None, blocked: tuple[str, ...] = (),
              remote_executor: str | None = None, strategy: list[str] | None = None,
              remote_local_fallback: bool | None = None, toolchain_mismatch: str = "error",
              shortcuts: bool = True) -> BuildOutcome:
        """Build in-process with the real engine; configuration errors become
        ``ok=False, exit_code=2`` with ``error`` set, failed actions ``exit_code=1``.

        The remote cache comes from the ``remote_*`` arguments (like the ``--remote_*``
        flags) and ``[remote]`` in ``qbuild.toml``, never from this process's environment.
        ``blocked`` names plugins not to load (like ``-p no:NAME``). The build goes
        through the command line's own ``commands.build.full_build``: the toolchain pins
        are checked, the digest memo kept, stale sandboxes swept, and (with
        ``shortcuts``) the analysis cache and incremental path used and the no-op
        snapshot recorded, as for a user's ``qbuild build``.
        """
        import time

        from .build.progress import ConsoleReporter
        from .build.run import BuildOptions
        from .build.session import Session
        from .commands.build import BuildRequest, full_build
        from .shortcuts.noop import environment

        log = io.StringIO()
        session = None
        # A test workspace keeps its own cache even when the caller's environment points
        # QBUILD_CACHE_DIR at a shared one (as CI jobs do): tests must not see each other.
        shared_cache = os.environ.pop("QBUILD_CACHE_DIR", None)
        try:
            session, package = Session.open(
                self.root / cwd, plugins=self.plugins, blocked=blocked,
                remote_flags={"cache": remote_cache, "upload": remote_upload,
                              "timeout": remote_timeout, "headers": remote_headers},
                environ={}, entry_point_cache=False)
            from .execution.dask_executor import resolve_executor

            executor = resolve_executor(session.workspace.root, {
                "executor": remote_executor, "strategy": strategy,
                "local_fallback": remote_local_fallback}, environ={})
            if executor is not None and session.remote is None:
                raise QbuildError("remote_executor needs a remote cache")
            started = time.time()
            request = BuildRequest(
                list(patterns), package,
                BuildOptions(jobs=jobs, keep_going=keep_going, explain=explain, cpu=cpu,
                             memory=memory, remote_executor=executor),
                started=started, toolchain_mismatch=toolchain_mismatch,
                environment=environment(_options_digest(self.plugins, blocked, remote_cache,
                                                        remote_upload, remote_headers,
                                                        remote_timeout))
                if shortcuts else None)
            result = full_build(session, request, ConsoleReporter(log, tty=False),
                                lambda line: print(line, file=log)).build.result
            output_dir = session.workspace.output_dir
        except QbuildError as exc:
            return BuildOutcome(ok=False, exit_code=exc.exit_code, error=str(exc),
                                log=log.getvalue())
        finally:
            if shared_cache is not None:
                os.environ["QBUILD_CACHE_DIR"] = shared_cache
            if session is not None:
                session.close()
        errors = "\n".join(f"{label}: {message}" for label, message in result.failed.items())
        return BuildOutcome(
            ok=result.ok, exit_code=0 if result.ok else 1, ran=result.ran,
            cached=result.cached, remote_hits=result.remote_hits, remote=result.remote,
            failed=result.failed, skipped=result.skipped, tolerated=result.tolerated,
            error=errors,
            log=log.getvalue(), bytes_hashed=result.bytes_hashed,
            explanations=result.explanations, _outputs={label: [Path(path) for path in paths]
                                                        for label, paths in result.outputs.items()},
            _infos=result.infos,
            remote_execution=result.remote_execution,
            actions=result.actions, _providers=result.providers,
            _output_dir=output_dir,
        )

    def aquery(self, *patterns: str) -> list[dict[str, Any]]:
        """The records ``qbuild aquery --output=json`` prints, computed in-process with
        this workspace's plugins (keys from what the cache holds; nothing runs)."""
        from .build.session import Session
        from .commands.aquery import actions

        session, package = Session.open(self.root, plugins=self.plugins,
                                        entry_point_cache=False)
        try:
            return actions(session, session.graph.expand(list(patterns), package))
        finally:
            session.close()

    def cli(self, *args: str, cwd: str = "", timeout: float = 300,
            env: dict[str, str] | None = None) -> CliOutcome:
        """Run the real ``qbuild`` command line in a subprocess (entry-point plugins only)."""
        full_env = dict(os.environ)
        for name in ("QBUILD_CACHE_DIR", "QBUILD_REMOTE_CACHE",
                     "QBUILD_REMOTE_UPLOAD_LOCAL_RESULTS"):
            full_env.pop(name, None)
        full_env.update(env or {})
        proc = subprocess.run([sys.executable, "-m", "qbuild", *args], cwd=self.root / cwd,
                              capture_output=True, text=True, timeout=timeout, env=full_env)
        return CliOutcome(proc.returncode, proc.stdout, proc.stderr)


class FakeExecutor:
    """An ``Executor`` on a virtual clock, for exact scheduling tests (in the manner of
    ninja's fake command runner): nothing runs; an action "takes" ``durations[label]``
    time units (default 1) and fails if its label is in ``fail``. The scheduler waits
    through ``wait``, which advances the clock to the next end and finishes every action
    ending then. ``started`` and ``finished`` list (time, label) in order."""

    def __init__(self, durations: Mapping[str, float] | None = None,
                 fail: Iterable[str] = (), default: float = 1.0) -> None:
        self.durations = dict(durations or {})
        self.fail = set(fail)
        self.default = default
        self.now = 0.0
        self.started: list[tuple[float, str]] = []
        self.finished: list[tuple[float, str]] = []
        self.actions: dict[str, TargetActions] = {}
        self._pending: dict[concurrent.futures.Future[Outcome],
                            tuple[float, int, TargetActions]] = {}

    def submit(self, action: TargetActions) -> concurrent.futures.Future[Outcome]:
        import concurrent.futures

        future: concurrent.futures.Future[Outcome] = concurrent.futures.Future()
        future.set_running_or_notify_cancel()
        label = str(action.label)
        self.started.append((self.now, label))
        self.actions[label] = action
        end = self.now + self.durations.get(label, self.default)
        self._pending[future] = (end, len(self.started), action)
        return future

    def wait(self, fs: Iterable[concurrent.futures.Future[Outcome]], *, return_when: str
             ) -> tuple[set[concurrent.futures.Future[Outcome]],
                        set[concurrent.futures.Future[Outcome]]]:
        from .core.records import ActionResult, Outcome
        from .execution.failures import ActionFailed

        fs = set(fs)
        if not any(f.done() for f in fs):
            end = min(self._pending[f][0] for f in fs)
            self.now = end
            for future in sorted((f for f in fs if self._pending[f][0] == end),
                                 key=lambda f: self._pending[f][1]):
                _end, _seq, action = self._pending.pop(future)
                label = str(action.label)
                self.finished.append((end, label))
                if label in self.fail:
                    future.set_exception(ActionFailed(f"{label} failed (fake)"))
                else:
                    future.set_result(Outcome(ActionResult((), action.outputs),
                                              self.durations.get(label, self.default)))
        done = {f for f in fs if f.done()}
        return done, fs - done

    def running_at(self, time: float) -> list[str]:
        """Labels running at ``time`` (started at or before it, finishing after it)."""
        ends = dict((label, t) for t, label in self.finished)
        return [label for t, label in self.started
                if t <= time < ends.get(label, float("inf"))]

    def close(self) -> None:
        pass

    def kill(self) -> None:
        pass


@pytest.fixture
def qbuild_workspace(tmp_path: Path) -> Iterator[Workspace]:
    """A fresh workspace under ``tmp_path/ws`` with its cache in ``tmp_path/cache``."""
    yield Workspace(tmp_path / "ws", tmp_path / "cache")
