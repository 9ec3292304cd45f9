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
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from ._errors import QbuildError

__all__ = ["BuildOutcome", "CliOutcome", "Workspace", "qbuild_workspace"]


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
    error: str = ""
    log: str = ""
    bytes_hashed: int = 0
    explanations: dict[str, list[str]] = field(default_factory=dict)
    _outputs: dict[str, list[Path]] = field(default_factory=dict)
    _infos: dict[str, dict[str, Any]] = field(default_factory=dict)

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
        from ._workspace import load_workspace

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
              remote_headers: list[str] | None = None, remote_executor: str | None = None,
              strategy: list[str] | None = None,
              remote_local_fallback: bool | None = None) -> BuildOutcome:
        """Build in-process with the real engine; configuration errors become
        ``ok=False, exit_code=2`` with ``error`` set, failed actions ``exit_code=1``.

        The remote cache comes from the ``remote_*`` arguments (like the ``--remote_*``
        flags) and ``[remote]`` in ``qbuild.toml``, never from this process's environment.
        """
        from ._build import Build, BuildOptions, Session
        from ._plugins import load_registry
        from ._progress import ConsoleReporter
        from ._workspace import load_workspace

        log = io.StringIO()
        session = None
        # A test workspace keeps its own cache even when the caller's environment points
        # QBUILD_CACHE_DIR at a shared one (as CI jobs do): tests must not see each other.
        shared_cache = os.environ.pop("QBUILD_CACHE_DIR", None)
        try:
            from ._remote_store import resolve_remote

            workspace = load_workspace(self.root / cwd)
            remote = resolve_remote(workspace.root, {
                "cache": remote_cache, "upload": remote_upload, "timeout": remote_timeout,
                "headers": remote_headers}, environ={})
            from ._dask_executor import resolve_executor

            executor = resolve_executor(workspace.root, {
                "executor": remote_executor, "strategy": strategy,
                "local_fallback": remote_local_fallback}, environ={})
            if executor is not None and remote is None:
                raise QbuildError("remote_executor needs a remote cache")
            session = Session(workspace, load_registry(self.plugins), remote)
            package = workspace.package_of(self.root / cwd)
            labels = session.graph.expand(list(patterns), package)
            build = Build(session, BuildOptions(jobs=jobs, keep_going=keep_going,
                                                explain=explain, cpu=cpu, memory=memory,
                                                remote_executor=executor),
                          ConsoleReporter(log, tty=False))
            result = build.run(labels)
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
            failed=result.failed, skipped=result.skipped, error=errors,
            log=log.getvalue(), bytes_hashed=result.bytes_hashed,
            explanations=result.explanations, _outputs=result.outputs, _infos=result.infos,
            remote_execution=result.remote_execution,
        )

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


@pytest.fixture
def qbuild_workspace(tmp_path: Path) -> Iterator[Workspace]:
    """A fresh workspace under ``tmp_path/ws`` with its cache in ``tmp_path/cache``."""
    yield Workspace(tmp_path / "ws", tmp_path / "cache")
