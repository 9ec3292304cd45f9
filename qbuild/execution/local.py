"""Running one action on this machine: stage its declared inputs in a private sandbox,
call the rule (in a worker process when the rule is heavy), check and store its declared
outputs.

``LocalExecutor`` implements the ``core.protocols.Executor`` seam: ``submit`` takes an
``TargetActions`` record (plain and picklable: rule reference, attributes, input digests) and
returns a future of its ``Outcome``. A distributed executor takes the same record: it
needs only the store's blobs and the rule's importable module.

Owns: the threads actions run in. A target's declared actions (a rule's ``run`` is one
of them) are ``actions.execute_actions``'s; sandbox folders, worker processes, and moving
files between a sandbox and the store are ``sandbox.Sandboxes``'s.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING

from ..core.labels import output_folder
from ..core.protocols import Store
from ..core.records import Outcome, TargetActions
from ..store.digests import SourceDigests
from .actions import execute_actions
from .sandbox import Sandboxes

if TYPE_CHECKING:
    import concurrent.futures


label_dir = output_folder


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

    def submit(self, action: TargetActions) -> concurrent.futures.Future[Outcome]:
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

    def execute(self, action: TargetActions) -> Outcome:
        """Run ``action`` (its declared actions, each cached on its own key); raises
        ActionFailed or MissingBlob. Nothing partial is stored."""
        return execute_actions(self.sandboxes, action)


