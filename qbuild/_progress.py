"""Progress and results as the user sees them, and the JSON-lines event log for CI.

On a terminal: one live status line ``[done/total] running: label, 3.2s``. Otherwise:
one line per action that ran or failed. Always a closing summary.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import IO, Any


class Reporter:
    """Receives build events; the base class ignores them."""

    def build_started(self, total: int) -> None: ...
    def action_started(self, label: str) -> None: ...
    def action_finished(self, event: dict[str, Any]) -> None: ...
    def message(self, text: str) -> None: ...
    def build_finished(self, summary: dict[str, Any]) -> None: ...


class ConsoleReporter(Reporter):
    def __init__(self, stream: IO[str] | None = None, tty: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.total = 0
        self.done = 0
        self.running: dict[str, float] = {}
        self._lock = threading.Lock()
        self._status_shown = False
        self._ticker: threading.Thread | None = None
        self._stop = threading.Event()

    def _clear(self) -> None:
        if self._status_shown:
            self.stream.write("\r\x1b[2K")
            self._status_shown = False

    def _status(self) -> None:
        if not self.tty or not self.running:
            return
        label, since = next(iter(self.running.items()))
        more = f" (+{len(self.running) - 1} more)" if len(self.running) > 1 else ""
        line = f"[{self.done}/{self.total}] running: {label}{more}, {time.monotonic() - since:.1f}s"
        self.stream.write("\r\x1b[2K" + line[:200])
        self.stream.flush()
        self._status_shown = True

    def _tick(self) -> None:
        while not self._stop.wait(0.5):
            with self._lock:
                self._status()

    def build_started(self, total: int) -> None:
        self.total = total
        if self.tty:
            self._ticker = threading.Thread(target=self._tick, daemon=True)
            self._ticker.start()

    def action_started(self, label: str) -> None:
        with self._lock:
            self.running[label] = time.monotonic()
            self._status()

    def action_finished(self, event: dict[str, Any]) -> None:
        with self._lock:
            self.running.pop(event["label"], None)
            self.done += 1
            status = event["status"]
            self._clear()
            for warning in event.get("warnings", []):
                self.stream.write(f"WARNING: {event['label']}: {warning}\n")
            if status == "failed":
                self.stream.write(f"FAILED: {event['label']}: {event.get('error', '')}\n")
                tail = event.get("log_tail")
                if tail:
                    self.stream.write("  --- last lines of the action log ---\n")
                    for line in tail.splitlines():
                        self.stream.write(f"  | {line}\n")
            elif status == "ran" and not self.tty:
                self.stream.write(f"[{self.done}/{self.total}] built {event['label']} "
                                  f"({event['seconds']:.2f}s)\n")
            self._status()
            self.stream.flush()

    def message(self, text: str) -> None:
        with self._lock:
            self._clear()
            self.stream.write(text.rstrip("\n") + "\n")
            self._status()
            self.stream.flush()

    def build_finished(self, summary: dict[str, Any]) -> None:
        self._stop.set()
        with self._lock:
            self._clear()
            word = "Build OK" if summary["ok"] else "Build FAILED"
            line = (f"{word}: {summary['targets']} targets, {summary['actions_run']} actions "
                    f"run, {summary['cache_hits']} cache hits")
            if summary.get("remote_cache_hits"):
                line += f" ({summary['remote_cache_hits']} from the remote cache)"
            remote = summary.get("remote")
            if remote and (remote["bytes_downloaded"] or remote["bytes_uploaded"]):
                line += (f", remote {_mb(remote['bytes_downloaded'])} down / "
                         f"{_mb(remote['bytes_uploaded'])} up")
            if summary["failed"]:
                line += f", {summary['failed']} failed"
            if summary["skipped"]:
                line += f", {summary['skipped']} skipped"
            line += f", {summary['seconds']:.2f}s"
            self.stream.write(line + "\n")
            self.stream.flush()


def _mb(count: int) -> str:
    return f"{count / 1e6:.1f} MB" if count >= 100_000 else f"{count / 1e3:.1f} kB"


class EventLogReporter(Reporter):
    """Writes one JSON object per event to a file (``--event_log``)."""

    def __init__(self, path: str) -> None:
        self.handle = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed at the end
        self._lock = threading.Lock()

    def _write(self, record: dict[str, Any]) -> None:
        with self._lock:
            self.handle.write(json.dumps(record, sort_keys=True) + "\n")
            self.handle.flush()

    def build_started(self, total: int) -> None:
        self._write({"event": "build_started", "total": total, "time": time.time()})

    def action_started(self, label: str) -> None:
        self._write({"event": "action_started", "label": label, "time": time.time()})

    def action_finished(self, event: dict[str, Any]) -> None:
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
