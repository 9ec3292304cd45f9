"""Progress and results as the user sees them, and the JSON-lines event log for CI.

On a terminal: one live status line ``[done/total] 2 running, 3 queued; slowest: label
3.2s``. Otherwise: one line per action that ran or failed. Always a closing summary
(unless quiet) with warnings grouped per rule, what failed and why it was skipped.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import IO, Any

from ..core import live


def human_size(size: int) -> str:
    """``73400320`` -> ``70.0 MB`` (powers of 1024, the units ``cache gc`` reads)."""
    value = float(size)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if value < 1024 or unit == "TB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def short_path(path: str) -> str:
    """A path with the home directory written as ``~``."""
    home = os.path.expanduser("~")
    if home not in ("", "/") and (path == home or path.startswith(home + os.sep)):
        return "~" + path[len(home):]
    return path


class Reporter:
    """Receives build events; the base class ignores them.

    ``action_queued`` when an action waits for a free job, ``action_started`` when it
    really starts running, ``action_finished`` with status ran/cached/failed/skipped.
    """

    def build_started(self, total: int) -> None: ...
    def action_queued(self, label: str) -> None: ...
    def action_started(self, label: str) -> None: ...
    def action_finished(self, event: dict[str, Any]) -> None: ...
    def message(self, text: str) -> None: ...
    def build_finished(self, summary: dict[str, Any]) -> None: ...


_SHOWN_LABELS = 5


_HOLD = 0.2  # seconds: "built" lines are held back at most this long off a terminal


def _labels(labels: list[str]) -> str:
    more = len(labels) - _SHOWN_LABELS
    return ", ".join(labels[:_SHOWN_LABELS]) + (f", ... ({more} more)" if more > 0 else "")


class ConsoleReporter(Reporter):
    """``quiet``: only failures; ``verbose``: every action and warning as it happens
    (by default warnings are grouped per rule and message at the end)."""

    def __init__(self, stream: IO[str] | None = None, tty: bool | None = None, *,
                 quiet: bool = False, verbose: bool = False) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.quiet = quiet
        self.verbose = verbose
        self.total = 0
        self.done = 0
        self.running: dict[str, float] = {}
        self.queued: set[str] = set()
        self.warnings: dict[tuple[str, str], list[tuple[str, str]]] = {}
        self._lock = threading.Lock()
        self._status_shown = False
        self._ticker: threading.Thread | None = None
        self._stop = threading.Event()
        self._lines: list[str] = []  # "built" lines not written yet (not on a terminal)

    def _write_lines(self) -> None:
        """Write the "built" lines held back (in order, before anything else)."""
        if self._lines:
            self.stream.write("".join(self._lines))
            self._lines.clear()
            self.stream.flush()

    def _clear(self) -> None:
        if self._status_shown:
            self.stream.write("\r\x1b[2K")
            self._status_shown = False

    def _status(self) -> None:
        if not self.tty or self.quiet or not (self.running or self.queued):
            return
        line = f"[{self.done}/{self.total}] {len(self.running)} running, {len(self.queued)} queued"
        if self.running:
            label, since = min(self.running.items(), key=lambda item: item[1])
            line += f"; slowest: {label} {time.monotonic() - since:.1f}s"
            done = live.read(label)  # what the action said of itself (ctx.progress)
            if done is not None:
                line += f", {done[0]}/{done[1]}"
        self.stream.write("\r\x1b[2K" + line[:200])
        self.stream.flush()
        self._status_shown = True

    def _tick(self) -> None:
        while not self._stop.wait(0.5 if self.tty else _HOLD):
            with self._lock:
                self._write_lines()
                self._status()

    def build_started(self, total: int) -> None:
        self.total = total
        if not self.quiet:
            self._ticker = threading.Thread(target=self._tick, daemon=True)
            self._ticker.start()

    def action_queued(self, label: str) -> None:
        with self._lock:
            self.queued.add(label)
            self._status()

    def action_started(self, label: str) -> None:
        with self._lock:
            self.queued.discard(label)
            self.running[label] = time.monotonic()
            self._status()

    def action_finished(self, event: dict[str, Any]) -> None:
        with self._lock:
            label = event["label"]
            self.running.pop(label, None)
            self.queued.discard(label)
            self.done += 1
            status = event["status"]
            self._clear()
            wrote = self.tty  # (the status line)
            for warning in event.get("warnings", []):
                if self.verbose:
                    self._write_lines()
                    wrote = True
                    self.stream.write(f"WARNING: {label}: {warning}\n")
                elif not self.quiet:
                    key = (event.get("rule", ""), warning.replace(label, "this target"))
                    self.warnings.setdefault(key, []).append((label, warning))
            # The summary repeats each failure with its reason, so the live line gives
            # the reason only when no summary follows (quiet).
            why = f": {event.get('error', '')}" if self.quiet else " (why: in the summary)"
            if status == "failed" and event.get("tolerated"):
                self._write_lines()
                wrote = True
                self.stream.write(f"failed (tolerated by its dependents): {label}{why}\n")
            elif status == "failed":
                self._write_lines()
                wrote = True
                self.stream.write(f"FAILED: {label}{why}\n")
                tail = event.get("log_tail")
                if tail:
                    self.stream.write("  --- last lines of the action log ---\n")
                    for line in tail.splitlines():
                        self.stream.write(f"  | {line}\n")
            elif not self.quiet and (status == "ran" and (not self.tty or self.verbose)
                                     or status != "ran" and self.verbose):
                word = "built" if status == "ran" else status
                where = f" on {event['worker']}" if event.get("worker") else ""
                line = f"[{self.done}/{self.total}] {word} {label} " \
                       f"({event['seconds']:.2f}s{where})\n"
                if not self.tty and status == "ran" and self._ticker is not None:
                    # Written by the ticker, many at a time: one write per action was
                    # a system call (and a hand-over of the interpreter) per action.
                    self._lines.append(line)
                    return
                self._write_lines()
                wrote = True
                self.stream.write(line)
            self._status()
            if wrote:  # (a flush per cached target is most of a large no-op's reporting)
                self.stream.flush()

    def message(self, text: str) -> None:
        if self.quiet:
            return
        with self._lock:
            self._clear()
            self._write_lines()
            self.stream.write(text.rstrip("\n") + "\n")
            self._status()
            self.stream.flush()

    def _write_warnings(self) -> None:
        for (rule, text), hits in self.warnings.items():
            if len(hits) == 1:
                self.stream.write(f"WARNING: {hits[0][0]}: {hits[0][1]}\n")
            else:
                labels = _labels(sorted(label for label, _ in hits))
                self.stream.write(f"WARNING: {rule} ({len(hits)} targets: {labels}): {text}\n")

    def build_finished(self, summary: dict[str, Any]) -> None:
        self._stop.set()
        with self._lock:
            self._clear()
            self._write_lines()
            if self.quiet:
                self.stream.flush()
                return
            self._write_warnings()
            self.stream.write(summary_line(summary) + "\n")
            for line in failure_lines(summary):
                self.stream.write(f"  {line}\n")
            self.stream.flush()


def summary_line(summary: dict[str, Any]) -> str:
    """``Build OK: 3 targets, 2 actions run, 1 cache hits, 0.52s; cache ~/.cache/qbuild
    (70.0 MB)``: failed actions that ran count among the actions run."""
    word = "Build OK" if summary["ok"] else "Build FAILED"
    if summary.get("interrupted"):
        word = "Build INTERRUPTED"
    run = summary["actions_run"] + summary.get("failed_ran", 0)
    line = f"{word}: {summary['targets']} targets, {run} actions run"
    if summary.get("failed_ran"):
        line += f" ({summary['failed_ran']} failed)"
    line += f", {summary['cache_hits']} cache hits"
    if summary.get("remote_cache_hits"):
        line += f" ({summary['remote_cache_hits']} from the remote cache)"
    remote = summary.get("remote")
    if remote and (remote["bytes_downloaded"] or remote["bytes_uploaded"]):
        line += (f", remote {human_size(remote['bytes_downloaded'])} down / "
                 f"{human_size(remote['bytes_uploaded'])} up")
    not_placed = sum(1 for f in summary.get("failures", []) if _stage(f) == "not_placed")
    not_run = summary["failed"] - summary.get("failed_ran", 0) - not_placed
    if not_run > 0:
        line += f", {not_run} failed before running"
    if not_placed:
        line += f", {not_placed} built but not placed"
    if summary["skipped"]:
        line += f", {summary['skipped']} skipped"
    if summary.get("tolerated"):
        line += f", {len(summary['tolerated'])} failed or skipped (tolerated)"
    line += f", {summary['seconds']:.2f}s"
    executed = summary.get("remote_execution")
    if executed and (executed["remote_actions"] or executed["fallback"]):
        workers = ", ".join(f"{w} {n}" for w, n in executed["workers"].items())
        line += (f", {executed['remote_actions']} run on {len(executed['workers'])} Dask "
                 f"workers" + (f" ({workers})" if workers else ""))
        if executed["fallback"]:
            line += " (then here: scheduler unreachable)"
    if summary.get("cache_dir"):
        line += f"; cache {short_path(summary['cache_dir'])}"
        if summary.get("cache_bytes") is not None:
            line += f" ({human_size(summary['cache_bytes'])})"
    return line


_WHY = {
    "ran": "it ran; a failure is never cached, so the next build runs it again",
    "not_started": "it could not start: refused, or its inputs could not be prepared; "
                   "the next build tries it again",
    "not_placed": "its result was made or found in the cache, but its outputs could not "
                  "be placed; the next build places them again",
}


def _stage(failure: dict[str, Any]) -> str:
    """Where a summary's failure happened (a summary written before ``stage`` existed
    says only whether it ran)."""
    stage = failure.get("stage")
    if stage in _WHY:
        return str(stage)
    return "ran" if failure.get("ran") else "not_started"


def failure_lines(summary: dict[str, Any]) -> list[str]:
    """One line per failed target saying where it failed (while it ran, before it
    could start, or while its outputs were placed), and why targets were skipped."""
    lines = []
    for failure in summary.get("failures", []):
        lines.append(f"failed: {failure['label']} ({_WHY[_stage(failure)]}): "
                     f"{failure['error']}")
    skipped = summary.get("skipped_reasons", {})
    for label, reason in list(skipped.items())[:_SHOWN_LABELS]:
        lines.append(f"skipped: {label} ({reason})")
    if len(skipped) > _SHOWN_LABELS:
        lines.append(f"skipped: ... and {len(skipped) - _SHOWN_LABELS} more")
    tolerated = summary.get("tolerated", {})
    for label, reason in list(tolerated.items())[:_SHOWN_LABELS]:
        lines.append(f"tolerated: {label} (its dependents build without it; a failure is "
                     f"never cached, so the next build tries it again): {reason}")
    if len(tolerated) > _SHOWN_LABELS:
        lines.append(f"tolerated: ... and {len(tolerated) - _SHOWN_LABELS} more")
    return lines


class EventLogReporter(Reporter):
    """Writes one JSON object per event to a file (``--event_log``)."""

    def __init__(self, path: str) -> None:
        self.handle = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed at the end
        self._lock = threading.Lock()
        self._running: set[str] = set()
        self._queued: set[str] = set()

    def _write(self, record: dict[str, Any]) -> None:
        with self._lock:
            self.handle.write(json.dumps(record, sort_keys=True) + "\n")
            self.handle.flush()

    def build_started(self, total: int) -> None:
        self._write({"event": "build_started", "total": total, "time": time.time()})

    def action_queued(self, label: str) -> None:
        with self._lock:
            self._queued.add(label)
        self._write({"event": "action_queued", "label": label, "time": time.time()})

    def action_started(self, label: str) -> None:
        with self._lock:
            self._queued.discard(label)
            self._running.add(label)
            counts = {"running": len(self._running), "queued": len(self._queued)}
        self._write({"event": "action_started", "label": label, **counts, "time": time.time()})

    def action_finished(self, event: dict[str, Any]) -> None:
        with self._lock:
            self._running.discard(event["label"])
            self._queued.discard(event["label"])
        self._write({"event": "action_finished", **event, "time": time.time()})

    def build_finished(self, summary: dict[str, Any]) -> None:
        self._write({"event": "build_finished", **summary, "time": time.time()})
        self.handle.close()


class FanOut(Reporter):
    def __init__(self, *reporters: Reporter) -> None:
        self.reporters = reporters

    def build_started(self, total: int) -> None:
        for r in self.reporters:
            r.build_started(total)

    def action_queued(self, label: str) -> None:
        for r in self.reporters:
            r.action_queued(label)

    def action_started(self, label: str) -> None:
        for r in self.reporters:
            r.action_started(label)

    def action_finished(self, event: dict[str, Any]) -> None:
        for r in self.reporters:
            r.action_finished(event)

    def message(self, text: str) -> None:
        for r in self.reporters:
            r.message(text)

    def build_finished(self, summary: dict[str, Any]) -> None:
        for r in self.reporters:
            r.build_finished(summary)
