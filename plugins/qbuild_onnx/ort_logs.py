"""Quiet, trustworthy output: onnxruntime's own log lines go to the action log,
deduplicated, with one line on the console saying how many there were.

onnxruntime talks on two channels: its Python quantization tools log through the root
``logging`` logger (which, with no handler configured, prints every WARNING to stderr),
and its C++ core writes straight to file descriptor 2 (session warnings such as removed
initializers). ``ort_output_to_log`` captures both for the duration of a block: Python
records through a handler on the root logger, and fd 2 through a temporary file swapped
in with ``os.dup2``. Heavy rules run one action per worker process, so swapping fd 2
does not mix two actions' output.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from qbuild import RunContext

Log = Callable[[str], None]
# "2026-11-23 19:01:02.123456789 [W:onnxruntime:, graph.cc:123 Foo] msg": drop the stamp so
# repeats of one message count as one line.
_STAMP = re.compile(r"^\S+ \d\d:\d\d:\d\d\.\d+ ")


class _Collector(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"onnxruntime ({record.levelname.lower()}): {record.getMessage()}")


def summarize(lines: list[str], log: Log) -> tuple[int, int]:
    """Log each distinct line once (with its repeat count); return (total, distinct)."""
    counts = Counter(_STAMP.sub("", ln.rstrip()) for ln in lines if ln.strip())
    for text, n in counts.items():
        log(text if n == 1 else f"{text}  (x{n})")
    return sum(counts.values()), len(counts)


@contextmanager
def ort_output_to_log(log: Log, warn: Log | None = None, capture_fd: bool = True
                      ) -> Iterator[None]:
    """Send onnxruntime's log lines inside the block to ``log`` (deduplicated) and, if any,
    one summary line to ``warn``."""
    import multiprocessing

    # Only a worker process owns its fd 2; in the engine's process it is the console's.
    capture_fd = capture_fd and multiprocessing.parent_process() is not None
    collector = _Collector()
    root = logging.getLogger()
    root.addHandler(collector)
    saved_fd = tmp = None
    if capture_fd:
        try:
            tmp = tempfile.TemporaryFile(mode="w+b")
            saved_fd = os.dup(2)
            os.dup2(tmp.fileno(), 2)
        except OSError:
            saved_fd = None
    try:
        yield
    finally:
        root.removeHandler(collector)
        native: list[str] = []
        if saved_fd is not None and tmp is not None:
            os.dup2(saved_fd, 2)
            os.close(saved_fd)
            tmp.seek(0)
            native = tmp.read().decode("utf-8", "replace").splitlines()
        if tmp is not None:
            tmp.close()
        total, distinct = summarize(collector.lines + native, log)
        if total and warn is not None:
            warn(f"onnxruntime printed {total} log line(s) ({distinct} distinct); read "
                 f"them with: qbuild log {RunContext.THIS_TARGET}")
