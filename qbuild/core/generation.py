"""The fact generation: how long a memo of facts that keys rest on may live.

A plugin that memoises what it reads for keys (the ``command`` rule's tool digests and
PATH listings, stat'ed once per build rather than once per target) keys its memo on
``fact_generation()``. The engine starts a new generation when a build finishes and
when a remote worker takes a new request, so no such memo outlives one request: a tool
upgraded on a worker's machine is seen by the worker's identity check of the next action.
"""

from __future__ import annotations

_generation = [0]
GENERATION = _generation
"""``GENERATION[0]`` is ``fact_generation()``, read without a call where every target
asks (never written but by ``new_fact_generation``)."""


def fact_generation() -> int:
    """The current generation: memos of key facts made under another are stale."""
    return _generation[0]


def new_fact_generation() -> None:
    """Start a new generation (a build finished, or a worker took a request)."""
    _generation[0] += 1
