"""Decoding the build's large records (the analysis cache, the incremental record, the
workspace state, the no-op snapshot) with the cyclic garbage collector paused.

A record of 10,000 targets is hundreds of thousands of new dicts, lists and strings;
each allocation counts towards the next collection, which then walks them all again,
although JSON (and what is built from it) holds no reference cycles to collect. Pausing
the collector while decoding saves that walk; it is switched back on as it was.
"""

from __future__ import annotations

import contextlib
import gc
import json
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic collector off inside the block (if it was on), on again after."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def loads(text: str | bytes) -> Any:
    """``json.loads`` with the collector paused."""
    with collector_paused():
        return json.loads(text)
