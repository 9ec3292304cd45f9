"""The typed records the engine passes between its parts: an action to run, the result
it produced (as the cache stores it) and the outcome of running it.

They are frozen dataclasses with no absolute paths, picklable, so a distributed
executor takes the same ``TargetActions`` and returns the same ``Outcome``. Only the store
turns results into JSON (``to_json``/``from_json``); nothing else handles them as dicts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from .labels import Label

_new = object.__new__

KeyParts = dict[str, Any]
"""The components of an action key (canonical JSON; ``qbuild explain`` diffs them)."""


@dataclass(frozen=True)
class OutputEntry:
    """One output file of an action: its path below the target's output folder."""

    path: str
    digest: str
    size: int = 0
    executable: bool = False

    def to_json(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"path": self.path, "digest": self.digest, "size": self.size}
        if self.executable:
            entry["x"] = True
        return entry

    @classmethod
    def from_json(cls, entry: Mapping[str, Any]) -> OutputEntry:
        # Fields set as the generated __init__ would (it sets each through
        # object.__setattr__, a frozen class's only way): a build reads thousands.
        made = _new(cls)
        made.__dict__.update(path=entry["path"], digest=entry["digest"],
                             size=int(entry.get("size", 0) or 0), executable=bool(entry.get("x")))
        return made

    @classmethod
    def checked(cls, path: str, digest: str, size: int, executable: bool) -> OutputEntry:
        """An entry from fields the store's gate has checked (no conversions)."""
        made = _new(cls)
        made.__dict__.update(path=path, digest=digest, size=size, executable=executable)
        return made


@dataclass(frozen=True)
class ActionResult:
    """What an action produced, as cached: output files, the declared output names (in
    order), the info its rule returned, its warnings, and where it came from."""

    outputs: tuple[OutputEntry, ...]
    declared: tuple[str, ...]
    info: Mapping[str, Any] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    origin: Literal["local", "remote"] = "local"
    providers: Mapping[str, Any] = field(default_factory=dict)
    """Provider data by provider name (``_providers``), as the actions returned it."""
    log: OutputEntry | None = None
    """The action's log (what it printed and ``ctx.log`` wrote), a blob like an
    output's: kept with the result (``qbuild log``), never part of any key."""
    sources: Mapping[str, str] = field(default_factory=dict)
    """For outputs that are a source file forwarded unchanged (a ``filegroup``'s): the
    output's path -> the source's workspace path, so messages about the file name it
    as the user knows it. Never part of any key."""
    failed: str | None = None
    """Set only on the stand-in for a failed dependency that its dependent tolerates
    (``attr.label(tolerate_failures=True)``): the one-line reason. Never stored."""

    @classmethod
    def failure(cls, reason: str) -> ActionResult:
        """The stand-in a tolerating dependent gets for a failed or skipped dependency."""
        return cls((), (), failed=reason)

    def digests(self) -> dict[str, str]:
        """Digest of each output file by its path."""
        return {e.path: e.digest for e in self.outputs}

    def to_json(self) -> dict[str, Any]:
        record: dict[str, Any] = {"outputs": [e.to_json() for e in self.outputs],
                                  "declared": list(self.declared), "info": dict(self.info),
                                  "warnings": list(self.warnings)}
        if self.origin == "remote":
            record["origin"] = "remote"
        if self.providers:
            record["providers"] = dict(self.providers)
        if self.log is not None:
            record["log"] = self.log.to_json()
        if self.sources:
            record["sources"] = dict(self.sources)
        if self.failed is not None:
            record["failed"] = self.failed
        return record

    @classmethod
    def checked(cls, *, outputs: tuple[OutputEntry, ...], declared: tuple[str, ...],
                info: Mapping[str, Any], warnings: tuple[str, ...],
                origin: Literal["local", "remote"], providers: Mapping[str, Any],
                log: OutputEntry | None, sources: Mapping[str, str]) -> ActionResult:
        """A result from fields the store's gate has checked, each of its final type
        and its own (freshly parsed tables: not copied again), set as the generated
        ``__init__`` would, without its per-field calls."""
        made = _new(cls)
        made.__dict__.update(outputs=outputs, declared=declared, info=info,
                             warnings=warnings, origin=origin, providers=providers,
                             log=log, sources=sources, failed=None)
        return made

    @classmethod
    def from_json(cls, record: Mapping[str, Any]) -> ActionResult:
        """From a record the store has checked (``store.gate.check_entry``)."""
        made = _new(cls)
        entry = OutputEntry.from_json
        made.__dict__.update(
            outputs=tuple([entry(e) for e in record["outputs"]]),
            declared=tuple(record["declared"]), info=dict(record["info"]),
            warnings=tuple([str(w) for w in record.get("warnings", ())]),
            origin="remote" if record.get("origin") == "remote" else "local",
            providers=dict(record.get("providers") or {}),
            log=_log_entry(record.get("log")),
            sources=dict(record.get("sources") or {}),
            failed=None if record.get("failed") is None else str(record["failed"]))
        return made


def _log_entry(entry: Any) -> OutputEntry | None:
    """A stored result's log reference (None when absent or not of the written shape:
    a log is never worth refusing a result for)."""
    if isinstance(entry, Mapping) and isinstance(entry.get("digest"), str) and \
            isinstance(entry.get("path"), str):
        return OutputEntry.from_json(entry)
    return None


@dataclass(frozen=True)
class TargetActions:
    """Everything needed to run one target's actions (Bazel's words: a target has
    actions; the executor runs a target's actions as one unit), with no absolute paths.

    ``deps`` maps each dependency's label text (as the attributes name it) to its
    result; ``sources`` maps workspace-relative paths to (digest, stat key)."""

    label: Label
    build_file: str
    rule_ref: str
    heavy: bool
    attrs: Mapping[str, Any]
    attr_types: Mapping[str, str]
    sources: Mapping[str, tuple[str, str]]
    deps: Mapping[str, ActionResult]
    outputs: tuple[str, ...]
    key: str
    reproducible: bool = True  # False: may give other bytes when run again (timings)
    threads: int = 1  # cores granted by the scheduler (ctx.threads)
    memory_mib: int = 0  # memory the rule asked for (the scheduler's budget)
    # resources beyond cores and memory, by Dask resource name (``{"GPU": 1.0}``):
    # placement on a remote executor only
    accelerators: Mapping[str, float] = field(default_factory=dict)
    hooks: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Plugin hooks the rule calls, resolved in the main process: hook name -> the
    importable modules implementing it (see ``_hooks``)."""
    # The declared actions (``api.actions.ActionSpec``, each cached on its own key, see
    # ``execution.actions``), the key parts they share and each one's code digests.
    actions: tuple[Any, ...] = ()
    action_base: Mapping[str, Any] = field(default_factory=dict)
    action_code: tuple[Mapping[str, str], ...] = ()
    executable: tuple[str, ...] = ()  # executable sources
    keyed_by_action: bool = False  # one action: ``key`` is that action's own key


@dataclass(frozen=True)
class Outcome:
    """How running an action ended: its result and how long it took. ``status`` is
    "cached" when another process ran the same key while this one waited for it."""

    result: ActionResult
    seconds: float = 0.0
    status: Literal["ran", "cached"] = "ran"
    worker: str = ""  # the remote worker that ran it (empty: this machine)
    actions: tuple[tuple[str, str, str], ...] = ()
    """v2 targets: (mnemonic, key, "ran" | "cached") of each declared action."""
