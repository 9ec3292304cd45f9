"""The session: the engine objects one command works with, wired in one place.

Both the command line (``qbuild.cli``) and ``qbuild.testing`` open a ``Session``
(workspace, plugin registry, remote settings) and call ``Session.build``; the store,
source digests and the ``Keyer`` are made on first use, so commands that only analyse
(query, outputs) never open the cache.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ..analysis.graph import Graph
from ..analysis.plugins import Registry, load_registry
from ..analysis.workspace import Workspace, load_workspace
from ..core.protocols import Store
from ..keys.keyer import Keyer
from ..store.digests import SourceDigests

if TYPE_CHECKING:
    from ..store.http import RemoteConfig
    from ..store.remote import LayeredStore
    from .progress import Reporter
    from .run import Build, BuildOptions


class Session:
    """The workspace, its plugins and (lazily) its store, for one command."""

    def __init__(self, workspace: Workspace, registry: Registry,
                 remote: RemoteConfig | None = None) -> None:
        self.workspace = workspace
        self.registry = registry
        self.graph = Graph(workspace, registry)
        self.remote = remote
        self._store: Store | None = None
        self._remote_store: LayeredStore | None = None
        self._digests: SourceDigests | None = None
        self.known_digests: dict[str, tuple[str, str]] = {}  # see SourceDigests
        self._keyer: Keyer | None = None

    @classmethod
    def open(cls, cwd: Path, *, plugins: Iterable[ModuleType | Any] = (),
             remote_flags: Mapping[str, Any] | None = None,
             environ: Mapping[str, str] | None = None, blocked: Iterable[str] = (),
             entry_point_cache: bool = True) -> tuple[Session, str | None]:
        """The session of the workspace holding ``cwd`` and the package ``cwd`` is in.

        ``remote_flags`` (the ``--remote_*`` flags) is None for commands that never use
        a remote cache; ``environ`` replaces ``os.environ`` for the remote settings;
        ``blocked`` names plugins not to load (``-p no:NAME``) besides qbuild.toml's."""
        workspace = load_workspace(cwd)
        try:
            package: str | None = workspace.package_of(cwd)
        except ValueError:
            package = None
        remote = None
        env = os.environ if environ is None else environ
        if remote_flags is not None and (
                remote_flags.get("cache") is not None or workspace.has_remote
                or env.get("QBUILD_REMOTE_CACHE") is not None):
            from ..store.remote import resolve_remote

            remote = resolve_remote(workspace.root, remote_flags, environ=environ)
        cache_file = workspace.cache_dir / "entry_points.json" if entry_point_cache else None
        registry = load_registry(plugins, cache_file=cache_file,
                                 blocked=[*workspace.blocked_plugins, *blocked])
        return cls(workspace, registry, remote), package

    @property
    def store(self) -> Store:
        """The local store, layered over the remote cache when one is configured."""
        if self._store is None:
            from ..store.local import LocalStore

            local = LocalStore(self.workspace.cache_dir)
            if self.remote is not None:
                from ..store.remote import LayeredStore

                self._store = self._remote_store = LayeredStore(local, self.remote)
            else:
                self._store = local
        return self._store

    @property
    def remote_store(self) -> LayeredStore | None:
        """The store's remote layer, when a remote cache is configured (the build reports
        what it did, and a remote executor sends blobs through it)."""
        _ = self.store  # (made with the store)
        return self._remote_store

    @property
    def digests(self) -> SourceDigests:
        if self._digests is None:
            self._digests = SourceDigests(self.store, self.known_digests)
        return self._digests

    @property
    def keyer(self) -> Keyer:
        """The keys of this workspace's targets (``keys.keyer``)."""
        if self._keyer is None:
            self._keyer = Keyer(self.workspace.root, self.registry, self.digests,
                                lambda: self.store)
        return self._keyer

    def close(self) -> None:
        if self._store is not None:
            self._store.close()

    def build(self, patterns: list[str], package: str | None, options: BuildOptions,
              reporter: Reporter, started: float | None = None,
              incremental: Mapping[str, Any] | None = None) -> Build:
        """Build ``patterns`` (relative to ``package``); the returned ``Build`` holds the
        result and what the no-op fast path may rely on. ``started`` (the wall-clock
        start of a command-line build) turns the analysis cache on (``_analysis_cache``);
        ``incremental`` (the ``_noop.environment`` of the build) the incremental path
        too (``_incremental``): the last build's keys reused where nothing changed, and
        this build's recorded for the next.
        """
        from ..shortcuts import analysis_cache as _analysis_cache
        from ..shortcuts import incremental as _incremental
        from .run import Build, BuildSession

        labels = None
        if started is not None:
            labels = _analysis_cache.restore(self.graph, patterns, package)
        analysed = labels is None
        if labels is None:
            labels = self.graph.expand(patterns, package)
        use = started is not None and incremental is not None and self.remote is None \
            and options.remote_executor is None
        record = _incremental.record_path(self.workspace.output_dir, patterns, package)
        reuse = None
        if use and incremental is not None and not analysed and not options.explain:
            # (--explain always takes the full path)
            reuse = _incremental.Reuse.load(record, self.workspace.root,
                                            self.graph.analysis_digest, incremental,
                                            self.store)
        parts = BuildSession(self.workspace, self.registry, self.graph, self.remote,
                             self.store, self.digests, self.keyer, self.remote_store)
        build = Build(parts, options, reporter, reuse=reuse)
        build.run(labels)
        if started is not None and analysed:
            _analysis_cache.save(self.graph, patterns, package, labels, started)
        if use and build.result.ok:
            assert started is not None and incremental is not None
            _incremental.save(record, analysis=self.graph.analysis_digest, env=incremental,
                              store_dir=self.store.directory, started=started,
                              code_files=build.code_files(), targets=build.reusable(),
                              reuse=reuse)
        return build
