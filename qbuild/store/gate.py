"""The one gate every action-cache entry passes before a build uses it.

A store hands back what it read (a local index row, a remote ``ActionResult`` and its
metadata blob) as a parsed record; ``admit`` decides whether that record may stand for
the result of the key it was looked up under, and turns it into an ``ActionResult``.
Anything it refuses raises ``Refused`` (one line, no traceback): the caller treats it as
a miss, warns once, and records nothing. The gate never raises anything else and never
recurses into the data, so no entry, however nested or large, can crash a build.

What an admitted entry satisfies:

- **Bound to its key.** The key parts stored with it hash (``core.keyhash.key_hash``,
  the one function ``keys`` computes every key with) to the key it was looked up
  under: either the parts themselves or, for a target keyed by its one action, their
  ``key_parts`` member (``bound_parts``). An entry fetched for the wrong key (a proxy
  folding paths, a mis-mapped prefix, a buggy writer) is refused.
- **Paths inside the output folder.** Every output path is a normalized relative POSIX
  path (no ``/`` at either end, no empty, ``.`` or ``..`` segment, no NUL or
  backslash, segments of at most 255 bytes), listed once, no file inside another
  file's path, each one declared (by name, or under a declared folder ``name/``), and
  every declared file present.
- **Sizes bounded before a byte is written.** Each size is a whole number of bytes
  (an integer or its decimal string, never a float, a bool or ``1e999``) of at most
  ``MAX_BLOB_BYTES``; downloads are cut at that size (``store.http``).
- **Modes kept.** The executable bit is part of the entry (``x`` locally, REAPI's
  ``isExecutable`` remotely) and of the result.
- **Shapes explain can read.** The key parts (``check_parts``), info, providers and
  warnings are of the types the engine writes and nested at most ``MAX_DEPTH`` deep.

Public: ``admit`` (record + key + its stored key parts -> ``ActionResult``), and the
pieces it is made of for a store that needs one alone: ``check_result``,
``bound_parts``, ``check_parts``, ``safe_path``, ``size_of``, ``key_of`` and
``load_json`` (bounded parsing of bytes read from a store).
"""

from __future__ import annotations

import json
import re
from typing import Any

from ..core.keyhash import key_hash
from ..core.records import ActionResult, KeyParts, OutputEntry

MAX_BLOB_BYTES = (1 << 63) - 1  # REAPI sizes are int64
MAX_DEPTH = 200  # nesting of info, providers and key parts: far below the recursion limit
MAX_PATH_BYTES = 4000  # below PATH_MAX with the output folder in front
_NAME_BYTES = 255  # one path component
_BAD_PARTS = frozenset(("", ".", ".."))
_DIGEST = re.compile("[0-9a-f]{64}")


class Refused(ValueError):
    """An entry the gate keeps out; the message is the one-line reason."""


key_of = key_hash
"""The action key of ``parts``: ``core.keyhash.key_hash``, the very function the keyer
computes every key with (``keys.parts.target_key``,
``keys.action_keys.declared_action_key``)."""


def is_digest(text: object) -> bool:
    return isinstance(text, str) and len(text) == 64 and _hex64(text) is not None


_hex64 = _DIGEST.fullmatch
# Names ``safe_path`` accepted, as an output's path (``_SAFE``) or a declared output's
# name (``_SAFE_DECLARED``, a folder's with its "/"): output names repeat across targets
# and builds ("model.onnx"), so each is checked once per process, then found in a set.
# (Bounded: a process reading millions of distinct names checks the rest each time.)
_SAFE: set[str] = set()
_SAFE_DECLARED: set[str] = set()
_SAFE_LIMIT = 1 << 16


def load_json(raw: bytes, limit: int) -> Any:
    """``raw`` parsed as JSON; refused if longer than ``limit`` bytes, not UTF-8, not
    JSON, or nested deeper than ``MAX_DEPTH`` (the parser's own recursion limit stops
    deeper text before it is a problem)."""
    if len(raw) > limit:
        raise Refused(f"{len(raw)} bytes, more than the {limit} an entry may have")
    try:
        value = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise Refused("not UTF-8") from None
    except (ValueError, RecursionError) as exc:
        raise Refused(f"not JSON ({type(exc).__name__})") from None
    if _depth(value) > MAX_DEPTH:
        raise Refused(f"nested deeper than {MAX_DEPTH}")
    return value


def _depth(value: Any) -> int:
    """Nesting depth of a parsed JSON value, without recursion."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            items: Any = item.values()
        elif isinstance(item, (list, tuple)):
            items = item
        else:
            continue
        deepest = max(deepest, level)
        if level > MAX_DEPTH:
            return level
        stack.extend((child, level + 1) for child in items)
    return deepest


def size_of(value: Any) -> int:
    """A byte count from an entry: an int or a decimal string (proto3 JSON writes int64
    as a string), 0 to ``MAX_BLOB_BYTES``; never a float, bool or exponent."""
    if isinstance(value, bool):
        raise Refused("a size is not a number")
    if isinstance(value, str):
        if not value.isascii() or not value.isdigit() or len(value) > 19:
            raise Refused("a size is not a whole number of bytes")
        value = int(value)
    if not isinstance(value, int):
        raise Refused("a size is not a whole number of bytes")
    if not 0 <= value <= MAX_BLOB_BYTES:
        raise Refused("a size is out of range")
    return value


def safe_path(path: object) -> bool:
    """Is ``path`` a normalized relative path below a folder, naming something in it?
    ("a/b.txt" is; "", "/a", "a/../b", "./a", "a//b", "a/", a NUL, a lone surrogate or
    an over-long name are not.) The one rule for every path an entry names, and for the
    places that write files (placing outputs, staging a dependency's outputs) to refuse
    again, whoever handed them the entry."""
    if not isinstance(path, str) or not path or path[0] == "/" or "\0" in path:
        return False
    if path in _SAFE:
        return True
    try:
        # Text of n characters encodes to at most 4n bytes: short names (nearly all) are
        # checked without encoding the whole path, on the path every entry read takes.
        if len(path) > MAX_PATH_BYTES // 4 and len(path.encode("utf-8")) > MAX_PATH_BYTES:
            return False
        for part in path.split("/"):
            if part in _BAD_PARTS or (len(part) > _NAME_BYTES // 4 and
                                      len(part.encode("utf-8")) > _NAME_BYTES):
                return False
        if not path.isascii():
            path.encode("utf-8")  # a lone surrogate (JSON's \ud800) cannot name a file
    except UnicodeEncodeError:
        return False
    if len(_SAFE) < _SAFE_LIMIT:
        _SAFE.add(path)
    return True


def _safe_declared(name: object) -> bool:
    """Is ``name`` a declared output's name: a ``safe_path``, or one with a "/" after it
    (a declared folder)?"""
    if not isinstance(name, str):
        return False
    if name in _SAFE_DECLARED:
        return True
    if not safe_path(name[:-1] if name[-1:] == "/" else name):
        return False
    if len(_SAFE_DECLARED) < _SAFE_LIMIT:
        _SAFE_DECLARED.add(name)
    return True


def unsafe_name(result: ActionResult) -> str | None:
    """The first output path or declared name of ``result`` that is not ``safe_path``
    (a declared folder's without its "/"), or None: what the places writing a result's
    files check again, whoever handed it to them."""
    for entry in result.outputs:
        path = entry.path
        if not (isinstance(path, str) and (path in _SAFE or safe_path(path))):
            return str(path)
    for name in result.declared:
        if not (isinstance(name, str) and (name in _SAFE_DECLARED or _safe_declared(name))):
            return str(name).removesuffix("/")
    return None


def _str_map(value: Any, what: str) -> None:
    if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise Refused(f"{what} is not a table of strings")


def _str_list(value: Any, what: str) -> None:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise Refused(f"{what} is not a list of strings")


def check_result(record: Any, origin: str | None = "local") -> ActionResult:
    """The ``ActionResult`` of a parsed entry (as ``ActionResult.to_json`` writes it:
    ``outputs`` of ``{path, digest, size, x}``, ``declared``, ``info``, ``warnings``,
    ``providers``) once its paths, digests, sizes and shapes are checked; ``origin``
    says where it came from ("remote" for a remote cache's; None: as the entry records
    it). Raises ``Refused``.

    Every build reads an entry per target, so the checks build the result's records
    directly (no checked copy of the entry to convert again; the parsed tables are
    the result's own), skip what cannot fail (the walk of an empty table, the
    cross-check of one declared file that is present) and check each name once per
    process (``_SAFE``)."""
    if not isinstance(record, dict):
        raise Refused("the entry is not a JSON object")
    get = record.get
    outputs, declared = get("outputs"), get("declared")
    if origin is None:
        origin = get("origin")
    if "failed" in record:
        raise Refused("the stand-in of a failed action is never cached")
    if not isinstance(outputs, list):
        raise Refused("the entry lists no outputs")
    if not isinstance(declared, list):
        raise Refused("the declared outputs is not a list of strings")
    for name in declared:
        if not (isinstance(name, str) and (name in _SAFE_DECLARED or _safe_declared(name))):
            raise _bad_declared(name)
    info, warnings, providers = get("info"), get("warnings", _NONE), get("providers") or {}
    if not isinstance(info, dict) or not isinstance(providers, dict):
        raise Refused("the info or providers are not tables")
    if warnings:
        _str_list(warnings, "the warnings")
    elif not isinstance(warnings, list):
        raise Refused("the warnings is not a list of strings")
    if (info and _depth(info) > MAX_DEPTH) or (providers and _depth(providers) > MAX_DEPTH):
        raise Refused(f"info nested deeper than {MAX_DEPTH}")
    entries = tuple([_output(entry) for entry in outputs])
    if len(entries) != 1 or len(declared) != 1 or entries[0].path != declared[0]:
        _check_paths([entry.path for entry in entries], declared)
    log = get("log")  # never worth refusing a result for: dropped if malformed
    if log is not None:
        log = _log(log)
    sources = get("sources") or {}  # names for messages only: dropped if malformed
    if sources and not (isinstance(sources, dict) and all(
            isinstance(k, str) and safe_path(v) for k, v in sources.items())):
        sources = {}
    made = _new(ActionResult)
    made.__dict__.update(outputs=entries, declared=tuple(declared), info=info,
                         warnings=tuple(warnings) if warnings else (),
                         origin="remote" if origin == "remote" else "local",
                         providers=providers, log=log, sources=sources, failed=None)
    return made


def _bad_declared(name: Any) -> Refused:
    if not isinstance(name, str):
        return Refused("the declared outputs is not a list of strings")
    return Refused(f"declared output {name[:80]!r} is not a relative path inside the "
                   "output folder")


_new = object.__new__
_NONE: list[str] = []  # (never changed: the warnings of an entry that has none)


def _output(entry: Any) -> OutputEntry:
    """One checked output (or log) of an entry: ``OutputEntry.checked``'s record, made
    here without its call."""
    if not isinstance(entry, dict):
        raise Refused("an output is not a JSON object")
    get = entry.get
    path, digest = get("path"), get("digest")
    if not (isinstance(path, str) and (path in _SAFE or safe_path(path))):
        raise Refused(f"output path {str(path)[:80]!r} is not a relative path inside "
                      "the output folder")
    if not (isinstance(digest, str) and len(digest) == 64 and _hex64(digest) is not None):
        raise Refused(f"output {path} has no SHA-256 digest")
    executable = get("x", False)
    if executable is not False and executable is not True:
        raise Refused(f"output {path} has a malformed executable bit")
    size = get("size", 0)
    if type(size) is not int or not 0 <= size <= MAX_BLOB_BYTES:
        size = size_of(size)
    made = _new(OutputEntry)
    made.__dict__.update(path=path, digest=digest, size=size, executable=executable)
    return made


def _log(entry: Any) -> OutputEntry | None:
    """An entry's log reference, or None if it is not of the written shape."""
    if not isinstance(entry, dict):
        return None
    get = entry.get
    path, digest, size = get("path"), get("digest"), get("size", 0)
    if not (isinstance(path, str) and isinstance(digest, str) and len(digest) == 64
            and _hex64(digest) is not None):
        return None
    if type(size) is not int or not 0 <= size <= MAX_BLOB_BYTES:
        if not _is_size(size):
            return None
        size = size_of(size)
    made = _new(OutputEntry)
    made.__dict__.update(path=path, digest=digest, size=size, executable=bool(get("x")))
    return made


def _is_size(value: Any) -> bool:
    try:
        size_of(value)
    except Refused:
        return False
    return True


def _check_paths(paths: list[str], declared: list[str]) -> None:
    if len(set(paths)) != len(paths):
        raise Refused("an output path is listed twice")
    files = set(paths)
    for path in paths:  # no output inside another output file's path
        cut = path.rfind("/")
        while cut > 0:
            if path[:cut] in files:
                raise Refused(f"output {path} lies inside the output file {path[:cut]}")
            cut = path.rfind("/", 0, cut)
    folders = tuple(d for d in declared if d.endswith("/"))
    names = set(declared)
    for path in paths:
        if path not in names and not (folders and path.startswith(folders)):
            raise Refused(f"output {path} was not declared")
    for name in declared:
        if not name.endswith("/") and name not in files:
            raise Refused(f"declared output {name} is missing")


def check_parts(parts: Any) -> KeyParts:
    """``parts`` if they have the shape the engine writes and ``qbuild explain`` reads:
    a table whose code, sources and environment are tables of strings, whose attributes
    and dependencies are tables (each dependency with a table of output digests and
    info), nested at most ``MAX_DEPTH`` deep. Raises ``Refused``."""
    if not isinstance(parts, dict):
        raise Refused("the key parts are not a table")
    if _depth(parts) > MAX_DEPTH:
        raise Refused(f"the key parts are nested deeper than {MAX_DEPTH}")
    for name in ("code", "sources", "env"):
        if name in parts:
            _str_map(parts[name], f"key part {name!r}")
    for name in ("label", "rule", "plugin", "qbuild_version"):
        if name in parts and not isinstance(parts[name], (str, type(None))):
            raise Refused(f"key part {name!r} is not a string")
    for name in ("attrs", "hooks", "deps", "inputs"):
        if name in parts and not isinstance(parts[name], dict):
            raise Refused(f"key part {name!r} is not a table")
    for name in ("outputs", "executable_sources"):
        if name in parts and not isinstance(parts[name], list):
            raise Refused(f"key part {name!r} is not a list")
    for label, dep in parts.get("deps", {}).items():
        _check_dep(str(label)[:80], dep)
    inner = parts.get("key_parts")
    if inner is not None:
        check_parts(inner)
    return parts


def _check_dep(label: str, dep: Any) -> None:
    if not isinstance(dep, dict) or "info" not in dep:
        raise Refused(f"the key part of dependency {label} is malformed")
    _str_map(dep.get("outputs"), f"the outputs of dependency {label}")
    for name in ("declared", "executable"):
        if name in dep and not isinstance(dep[name], list):
            raise Refused(f"the {name} outputs of dependency {label} are not a list")


def bound_parts(parts: Any, key: str) -> KeyParts:
    """The parts ``key`` was hashed from, found in the key parts stored with its entry:
    the parts themselves, or their ``key_parts`` (a target keyed by its one action
    keeps the target's parts for ``qbuild explain`` and the action's, which make the
    key, beside them). Raises ``Refused`` unless one of them hashes to ``key``."""
    if not isinstance(parts, dict):
        raise Refused("no key parts were stored with the entry")
    if key_of(parts) == key:
        return parts
    inner = parts.get("key_parts")
    if isinstance(inner, dict) and key_of(inner) == key:
        return inner
    raise Refused("its key parts do not hash to the key it was stored under (an entry "
                  "made for another action)")


def admit(record: Any, key: str, parts: Any, origin: str = "local"
          ) -> tuple[ActionResult, KeyParts]:
    """The result and key parts of an entry looked up under ``key``: ``record`` is the
    parsed entry (as ``check_result`` takes it), ``parts`` the key parts stored with it.
    Both are checked (``check_result``, ``check_parts``) and bound to ``key``
    (``bound_parts``); raises ``Refused`` with the one-line reason otherwise."""
    try:
        checked = check_parts(parts)
        bound_parts(checked, key)
        return check_result(record, origin), checked
    except (RecursionError, TypeError, KeyError, AttributeError, OverflowError) as exc:
        # (The checks above look at every value's type first; this is a last net.)
        raise Refused(f"malformed entry ({type(exc).__name__})") from None


def check_entry(record: Any, key: str) -> ActionResult:
    """The ``ActionResult`` of an entry the local store read for ``key`` (its origin as
    recorded), checked as ``check_result`` checks a remote one. Raises ``Refused``."""
    return check_result(record, None)


def describe(key: str, refused: Refused) -> str:
    """The one line a store warns with when it refuses the entry of ``key``."""
    return f"refused the action-cache entry {key[:12]}: {refused}"


__all__ = ["MAX_BLOB_BYTES", "MAX_DEPTH", "Refused", "admit", "bound_parts", "check_entry",
           "check_parts", "check_result", "describe", "is_digest", "key_of", "load_json",
           "safe_path", "size_of", "unsafe_name"]

