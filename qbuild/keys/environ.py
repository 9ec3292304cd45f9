"""Environment variables the key facts were read from.

A rule's ``env()`` and ``target_env(attrs)`` may read environment variables (the machine
class, ``PATH``, a plugin's own settings). Their values enter keys, so the shortcuts,
which answer without asking the rules again, must see a change of any of them. While
qbuild asks a rule for its environment facts, ``os.environ`` is watched: every name read
(``os.environ[...]``, ``.get``, ``in``, ``os.getenv``) is noted with the value it had, and
a rule that lists the whole environment makes every variable count. ``reads()`` is what
the shortcuts record; ``unchanged(recorded)`` re-derives it from the environment with
dictionary lookups alone.
"""

from __future__ import annotations

import _thread
import os
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from typing import Any, TypeVar

T = TypeVar("T")

EVERYTHING = "*"
"""The recorded name standing for the whole environment (a rule listed it)."""

_read: dict[str, str | None] = {}
_lock = _thread.RLock()  # (threading costs the fast path an import)
_get_ident = _thread.get_ident
# Threads asking a rule for facts now, each with its depth of ``watched`` calls: only
# their reads count (an action running in another thread meanwhile may list the
# environment; that is not a key fact). Empty: os.environ is the real one.
_watching: dict[int, int] = {}
_wrapper: _Watched | None = None  # (one for every call: made once)


class _Watched(MutableMapping[str, str]):
    """``os.environ`` as seen by a rule's environment facts: reads are noted."""

    def __init__(self, real: MutableMapping[str, str]) -> None:
        self.real = real

    # Each read is one lookup in the real environment (its keys and values are encoded
    # and decoded on every lookup): every target's facts read PATH at least. Noted
    # in place (no call): a thread not watching reads what it reads unnoted.
    def __getitem__(self, name: str) -> str:
        value = self.real.get(name)
        if _get_ident() in _watching:
            _read[name] = value
        if value is None:
            raise KeyError(name)
        return value

    def get(self, name: str, default: Any = None) -> Any:
        value = self.real.get(name)
        if _get_ident() in _watching:
            _read[name] = value
        return default if value is None else value

    def __contains__(self, name: object) -> bool:
        value = self.real.get(name) if isinstance(name, str) else None
        if _get_ident() in _watching:
            _read[str(name)] = value
        return value is not None

    def __setitem__(self, name: str, value: str) -> None:
        self.real[name] = value

    def __delitem__(self, name: str) -> None:
        del self.real[name]

    def __iter__(self) -> Iterator[str]:
        _noted(EVERYTHING, None)
        return iter(self.real)

    def __len__(self) -> int:
        _noted(EVERYTHING, None)
        return len(self.real)

    def copy(self) -> dict[str, str]:
        """A plain copy (as ``os.environ.copy()``), which reads every variable."""
        _noted(EVERYTHING, None)
        return dict(self.real)


def _noted(name: str, value: str | None) -> None:
    if _get_ident() in _watching:
        _read[name] = value


def watched(call: Callable[..., T], *args: Any) -> T:
    """``call(*args)`` with every environment variable it reads noted (see ``reads``).

    os.environ is swapped for the watching wrapper while any thread is watching (the
    same variables, reads noted, os.getenv too), and put back when none is: a call per
    target, so kept to a few dictionary operations under the lock."""
    global _wrapper
    me = _get_ident()
    watching = _watching
    with _lock:
        if not watching:
            environ = os.environ
            wrapper = _wrapper
            if wrapper is None or wrapper.real is not environ:
                wrapper = _wrapper = _Watched(environ)
            os.environ = wrapper  # type: ignore[assignment]  # noqa: B003
        depth = watching.get(me, 0)
        watching[me] = depth + 1
        try:
            return call(*args)
        finally:
            if depth:
                watching[me] = depth
            else:
                del watching[me]
                if not watching:
                    environ = os.environ
                    os.environ = getattr(environ, "real", environ)  # noqa: B003


def forget() -> None:
    """Start a build's record: what earlier builds of this process read is not this
    one's (their variables may have changed since; the rules are asked again)."""
    with _lock:
        _read.clear()


def carry(recorded: Mapping[str, Any]) -> None:
    """Count ``recorded`` (a ``reads()`` still ``unchanged``) as read by this build: the
    incremental path reuses targets without asking their rules again."""
    with _lock:
        for name, value in recorded.items():
            _read.setdefault(name, None if name == EVERYTHING else value)


def reads() -> dict[str, Any]:
    """Every variable read by keyed facts in this build (since ``forget``), with its value then
    (``EVERYTHING`` maps to the whole environment when a rule listed it)."""
    with _lock:
        found: dict[str, Any] = dict(_read)
    if EVERYTHING in found:
        found[EVERYTHING] = dict(os.environ)
    return found


def unchanged(recorded: Mapping[str, Any]) -> bool:
    """Does the environment still hold every value in ``recorded`` (from ``reads``)?"""
    environ = os.environ
    for name, value in recorded.items():
        if name == EVERYTHING:
            if value != dict(environ):
                return False
        elif environ.get(name) != value:
            return False
    return True
