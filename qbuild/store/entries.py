"""The gate every action-cache entry passes before the engine uses it.

An entry is read from a place others can write: a cache folder shared between users,
restored by CI from another job, a shared volume, a remote cache. Whatever reads one
(the local store on every read, the remote layer before it copies an entry into the
local store, a worker's result before it is stored) asks ``check_entry``; an entry with
a problem is a miss (and dropped where it is stored), never a crash and never a path
out of the output folder. ``safe_path`` is the same rule for one path, for the places
that write files (placing outputs, staging a dependency's outputs into a sandbox) to
refuse again, whoever handed them the entry.

The entry is the JSON shape ``ActionResult.to_json`` writes:
``{"outputs": [{"path", "digest", "size", "x"?}], "declared": [...], "info": {...},
"warnings": [...], "providers": {...}, "origin"?}``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_DIGEST = re.compile(r"^[0-9a-f]{64}$")
_NAME_BYTES = 255  # one path component
_PATH_BYTES = 4000  # below PATH_MAX with the output folder in front
_BAD_PARTS = frozenset(("", ".", ".."))


def safe_path(path: object) -> bool:
    """Is ``path`` a normalized relative path below a folder, naming something in it?
    ("a/b.txt" is; "", "/a", "a/../b", "./a", "a//b", "a/", a NUL or an over-long name
    are not.)"""
    if not isinstance(path, str) or not path or path[0] == "/" or "\0" in path:
        return False
    # Text of n characters encodes to at most 4n bytes: short names (nearly all) are
    # not encoded at all, on the path every entry read takes.
    if len(path) > _PATH_BYTES // 4 and len(path.encode("utf-8", "surrogateescape")) \
            > _PATH_BYTES:
        return False
    for part in path.split("/"):
        if part in _BAD_PARTS or (len(part) > _NAME_BYTES // 4 and len(
                part.encode("utf-8", "surrogateescape")) > _NAME_BYTES):
            return False
    return True


def _check_outputs(outputs: list[Any], declared: list[Any]) -> str | None:
    files: set[str] = set()
    folders: list[str] = []
    for name in declared:
        if not isinstance(name, str) or not safe_path(name.removesuffix("/")):
            return f"declared output {str(name)[:80]!r} is not a relative path inside " \
                   "the output folder"
        if name.endswith("/"):
            folders.append(name)
        else:
            files.add(name)
    under = tuple(folders) or ("\0",)
    seen: set[str] = set()
    for entry in outputs:
        if not isinstance(entry, dict):
            return "an output is not an object"
        path, digest, size = entry.get("path"), entry.get("digest"), entry.get("size", 0)
        if not safe_path(path):
            return f"output path {str(path)[:80]!r} is not a relative path inside the " \
                   "output folder"
        assert isinstance(path, str)
        if path in seen:
            return f"output {path!r} is listed twice"
        seen.add(path)
        if path not in files and not path.startswith(under):
            return f"output {path!r} was not declared"
        if not isinstance(digest, str) or not _DIGEST.match(digest):
            return f"output {path!r} has a malformed digest"
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            return f"output {path!r} has a malformed size"
    return None


def check_entry(result: object, key: str) -> str | None:
    """What is wrong with the action-cache entry ``result`` stored for ``key``, or None
    if the engine may use it: the shape this version writes, every output a normalized
    relative path inside the target's output folder (no ``..``, no absolute path, no
    empty or ``.`` part, no NUL, no name over 255 bytes), each listed once, declared (or
    inside a declared folder), with a SHA-256 digest and a size that is a non-negative
    integer. The problem is one line naming the key, for a warning. Binding the entry to
    ``key`` (recomputing the key from the parts it was made from) is the caller's when
    it has those parts (a remote entry)."""
    problem = _problem(result)
    return None if problem is None else f"cache entry {key[:12]}: {problem}"


def _problem(result: object) -> str | None:
    if not isinstance(result, Mapping):
        return "not an object"
    if "failed" in result:  # a tolerated failure's stand-in is never a cached result
        return "a failure's stand-in"
    outputs, declared = result.get("outputs"), result.get("declared")
    if not isinstance(outputs, list) or not isinstance(declared, list):
        return "no list of outputs or of declared outputs"
    if not isinstance(result.get("info"), dict) or \
            not isinstance(result.get("warnings", []), list) or \
            not isinstance(result.get("providers", {}), dict):
        return "malformed info, warnings or providers"
    return _check_outputs(outputs, declared)
