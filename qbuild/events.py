"""The typed events qbuild's hooks receive (``qbuild.hookspecs``): frozen dataclasses.

``ActionEvent`` is what ``qbuild_action_finished`` gets after each action, and
``BuildSummary`` what ``qbuild_build_finished`` gets at the end of a build. Their
``to_json()`` is exactly the record written to the ``--event_log`` file.

Hook implementations written for the earlier dict events keep working: both classes
also answer ``event["label"]``, ``event.get("error")``, ``"key" in event`` and
``dict(event)`` (the keys of ``to_json()``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Status = Literal["ran", "cached", "failed", "skipped"]


class _DictView(Mapping[str, Any]):
    """Read-only mapping access to ``to_json()`` (for hooks written for dict events)."""

    def to_json(self) -> dict[str, Any]:
        raise NotImplementedError

    def __getitem__(self, name: str) -> Any:
        return self.to_json()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_json())

    def __len__(self) -> int:
        return len(self.to_json())


@dataclass(frozen=True, eq=True)
class ActionEvent(_DictView):
    """One action finished: ran, served from a cache, failed or skipped.

    ``key`` is the action key (None when the action was skipped or failed before it
    could be keyed); ``origin`` says where a result came from ("ran", "local_cache",
    "remote_cache"); ``error`` and ``log_tail`` are set for failures. ``tolerated``: a
    failed or skipped target that only dependents tolerating its failure needed
    (``attr.label(tolerate_failures=True)``): the build does not fail for it."""

    label: str
    status: Status
    seconds: float = 0.0
    key: str | None = None
    origin: str | None = None
    rule: str | None = None
    error: str | None = None
    log_tail: str | None = None
    warnings: tuple[str, ...] = ()
    worker: str | None = None  # the remote (Dask) worker that ran it
    tolerated: bool = False

    def to_json(self) -> dict[str, Any]:
        record: dict[str, Any] = {"label": self.label, "status": self.status,
                                  "seconds": round(self.seconds, 3), "key": self.key}
        if self.tolerated:
            record["tolerated"] = True
        if self.worker is not None:
            record["worker"] = self.worker
        if self.origin is not None:
            record["origin"] = self.origin
        if self.rule is not None:
            record["rule"] = self.rule
        if self.status == "ran":
            record["warnings"] = list(self.warnings)
        if self.status == "failed":
            record["error"] = self.error or ""
            record["log_tail"] = self.log_tail or ""
        return record

    __hash__ = object.__hash__


@dataclass(frozen=True, eq=True)
class Failure:
    """One failed target in a summary; ``ran``: it failed while running. ``stage``
    says where it failed: ``"ran"`` (while its actions ran), ``"not_started"`` (before
    its rule's code ran: it could not be keyed, its inputs could not be staged or
    restored, every worker refused it) or ``"not_placed"`` (it was built or found in
    the cache, but its outputs could not be placed)."""

    label: str
    error: str
    ran: bool
    stage: str = ""


@dataclass(frozen=True, eq=True)
class BuildSummary(_DictView):
    """The end of a build: counts, failures, timing and the cache in use."""

    ok: bool
    targets: int
    actions_run: int
    cache_hits: int
    failed: int
    skipped: int
    seconds: float
    bytes_hashed: int
    failed_ran: int
    failures: tuple[Failure, ...] = ()
    skipped_reasons: Mapping[str, str] = field(default_factory=dict)
    cache_dir: str = ""
    cache_bytes: int = 0
    interrupted: bool = False
    remote_cache_hits: int | None = None
    remote: Mapping[str, Any] | None = None
    remote_execution: Mapping[str, Any] | None = None  # _dask_executor's summary
    tolerated: Mapping[str, str] = field(default_factory=dict)
    """Failed or skipped targets whose dependents tolerate it: label -> reason."""

    def to_json(self) -> dict[str, Any]:
        record: dict[str, Any] = {
            "ok": self.ok, "targets": self.targets, "actions_run": self.actions_run,
            "cache_hits": self.cache_hits, "failed": self.failed, "skipped": self.skipped,
            "seconds": round(self.seconds, 3), "bytes_hashed": self.bytes_hashed,
            "failed_ran": self.failed_ran,
            "failures": [{"label": f.label, "error": f.error, "ran": f.ran,
                          "stage": f.stage or ("ran" if f.ran else "not_started")}
                         for f in self.failures],
            "skipped_reasons": dict(self.skipped_reasons),
            "cache_dir": self.cache_dir, "cache_bytes": self.cache_bytes}
        if self.interrupted:
            record["interrupted"] = True
        if self.tolerated:
            record["tolerated"] = dict(self.tolerated)
        if self.remote is not None:
            record["remote_cache_hits"] = self.remote_cache_hits
            record["remote"] = dict(self.remote)
        if self.remote_execution is not None:
            record["remote_execution"] = dict(self.remote_execution)
        return record

    __hash__ = object.__hash__
