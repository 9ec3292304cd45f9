"""The two seams the engine is typed against: ``Store`` (where results and blobs live)
and ``Executor`` (where actions run).

Implementations: ``store.local.LocalStore`` and ``store.remote.LayeredStore`` (a local
store in front of a Bazel HTTP cache); ``execution.local.LocalExecutor`` (this machine)
and ``qbuild.testing.FakeExecutor`` (a virtual clock for exact scheduling tests). A
distributed executor implements ``Executor``: take an ``TargetActions``, return a future of
its ``Outcome``; everything it needs is in the action and the store's blobs.

``Store`` names every capability the engine uses, and the engine calls them plainly:
it never asks a store what it is or whether it has a method (a store with nothing to do
for a capability implements it as a no-op). ``tests/engine/test_store_protocol.py``
checks that both stores implement every member and that nothing probes them.
"""

from __future__ import annotations

import concurrent.futures
import os
from pathlib import Path
from typing import Literal, Protocol

from .records import ActionResult, KeyParts, Outcome, TargetActions

Origin = Literal["local", "remote"]


class HeldLock(Protocol):
    """A lock across processes that this process holds until it calls ``release``."""

    def release(self) -> None:
        """Let the next process waiting for it go on."""


class Store(Protocol):
    """Action results by key, their key parts, code records, and verified blobs."""

    directory: Path  # the local cache's folder
    tmp: Path  # sandboxes of running actions live here

    # -- action cache --------------------------------------------------------------------
    def find_action(self, key: str, record: bool = True
                    ) -> tuple[ActionResult | None, Origin]:
        """The result of ``key`` and where it was found; a remote hit is recorded
        locally unless ``record`` is False."""

    def get_action(self, key: str) -> ActionResult | None:
        """The result of ``key``, or None (a miss; an entry of the wrong shape too)."""

    def prefetch_actions(self, keys: list[str]) -> None:
        """Read the entries of ``keys`` ahead, in a few queries, because each is about
        to be looked up once; a no-op for a store with nothing to read ahead."""

    def action_texts(self, keys: list[str]) -> dict[str, str]:
        """The stored text of the entries of ``keys`` it can read in a few queries (the
        rest are left out, for the caller to look up one by one)."""

    def put_action(self, key: str, result: ActionResult) -> None:
        """Record ``result`` under ``key``, after the blobs it names are durable."""

    def put_results(self, items: list[tuple[str, KeyParts, ActionResult]]) -> None:
        """Record several keys' parts and results, as ``put_components`` and
        ``put_action`` would, in as few writes as the store can."""

    def defer_sync(self) -> bool:
        """Make blobs durable in batches, before the next action entry is written,
        instead of one by one, so entries can be written in batches (``put_results``);
        False, changing nothing, if each entry must go alone through ``put_action``
        (a remote layer uploads each)."""

    def drop_action(self, key: str) -> None:
        """Forget the result of ``key`` (it is rebuilt when needed)."""

    def get_components(self, key: str) -> KeyParts | None:
        """The parts ``key`` was made of, if recorded (for ``qbuild explain``)."""

    def put_components(self, key: str, components: KeyParts) -> None:
        """Record the parts ``key`` was made of."""

    def lock_action(self, key: str) -> HeldLock | None:
        """Wait for and take the lock of ``key`` across processes, so one process runs
        it at a time; None when the store has no such lock (then two processes may
        both run it, both correctly)."""

    def get_code(self, digest: str) -> dict[str, str] | None:
        """The per-file digests of the code unit with ``digest``, if recorded."""

    def put_code(self, digest: str, files: dict[str, str]) -> None:
        """Record the per-file digests of the code unit with ``digest``."""

    # -- blobs ---------------------------------------------------------------------------
    def has_blob(self, digest: str) -> bool:
        """Does this machine's cache hold the blob of ``digest`` (unverified)?"""

    def put_blob(self, path: Path, digest: str, adopt: bool = False,
                 hashed: os.stat_result | None = None) -> bool:
        """Store the file at ``path``, already hashed to ``digest`` (renamed in if
        ``adopt``: the caller gives it away); True only if an adopted file was taken,
        False if it is still the caller's (an intact copy was stored already)."""

    def restore_blob(self, digest: str, dest: Path, executable: bool = False) -> bool:
        """Place a verified private copy of the blob at ``dest``; False if it is
        missing or corrupt everywhere the store looks."""

    def link_blob(self, digest: str, dest: Path) -> tuple[Path, os.stat_result] | None:
        """Hard-link the verified blob at ``dest``: its path and the link's stat, or
        None when it cannot (the caller copies with ``restore_blob`` instead)."""

    def trusts(self, digest: str, st: os.stat_result) -> bool:
        """Is the blob file with stat ``st`` known to hold the bytes of ``digest``?"""

    def vouch(self, digest: str, st: os.stat_result) -> None:
        """Remember that the blob of ``digest`` is intact with stat ``st``."""

    def discard_blob(self, digest: str, inode: tuple[int, int]) -> None:
        """Drop the blob of ``digest`` if its file is still ``inode`` (dev, ino): it
        was found modified."""

    @property
    def remote_usable(self) -> bool:
        """Can a result found remotely still have its blobs downloaded? (False for a
        store without a remote layer, or once the remote was given up on.)"""

    # -- source digests by stat, size, end of use ------------------------------------------
    def memo_get(self, key: str) -> str | None:
        """The digest remembered for a source file's stat key."""

    def memo_put(self, key: str, digest: str) -> None:
        """Remember a source file's digest by its stat key."""

    def volume(self) -> int:
        """Bytes the cache holds."""

    def close(self) -> None:
        """Write what is pending and release the store's resources."""


class Executor(Protocol):
    """Runs actions. ``submit`` returns at once; the future's result is the action's
    ``Outcome``, or it raises ``ActionFailed`` (the action failed) or ``MissingBlob`` (a
    dependency's output is gone from the store and must be rebuilt first)."""

    def submit(self, action: TargetActions) -> concurrent.futures.Future[Outcome]: ...
    def close(self) -> None: ...
    def kill(self) -> None: ...
