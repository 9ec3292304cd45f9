"""Code identity: which source files implement a rule, and their digests.

A rule's outputs depend on its code, not only on its hand-bumped ``version``. Every
action key therefore covers "code units": the top-level package (or single module) of
every class in the rule's MRO, the ``qbuild`` engine itself, and whatever the rule says
its action imports by name at run time (``Rule.code(attrs)``: ``module``,
``module:function`` or ``hook:<hook name>``, the plugins implementing that hook).

A unit's digest is the SHA-256 over its files' (relative path, digest) pairs. For a
wheel install the digests come from the distribution's ``RECORD`` while the file is as
installed: the size it lists, and an inode change time older than ``RECORD``'s (an
installer writes ``RECORD`` last; any later write or same-size edit, even with the mtime
put back, moves the change time past it). Otherwise (editable or local installs, plain
modules) files are hashed through the stat memo, so a no-op build stats them and hashes
nothing. The per-file
digests are kept so ``qbuild explain`` can name the file that changed.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..store.digests import SourceDigests

ENGINE_UNIT = "qbuild"
_SKIP_DIRS = {"__pycache__"}

# dist name -> {absolute file path: (hex sha256, size)} from RECORD, or None (editable).
_records: dict[str, dict[str, tuple[str, int]] | None] = {}
# dist name -> st_ctime_ns of its RECORD (files changed since are hashed), or None.
_installed: dict[str, int | None] = {}


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _dist_info(dist_name: str) -> Path | None:
    """The ``.dist-info`` folder of ``dist_name``: the first one on ``sys.path``, as
    ``importlib.metadata`` finds it (None if not found, or if an ``.egg-info`` of that
    name comes first: then ``importlib.metadata`` decides)."""
    wanted = _normal(dist_name)
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            stem, dot, suffix = name.rpartition(".")
            if suffix in ("dist-info", "egg-info") and dot and \
                    _normal(stem.partition("-")[0]) == wanted:
                return Path(entry or ".") / name if suffix == "dist-info" else None
    return None


def _read_record(dist_name: str) -> dict[str, tuple[str, int]] | None | bool:
    """``_record_hashes`` read straight from the ``.dist-info`` folder (importing
    ``importlib.metadata`` costs more than a no-op build's keying): the table, None for
    an editable install, or False when it cannot tell (then ``importlib.metadata``
    does)."""
    info = _dist_info(dist_name)
    if info is None:
        return False
    try:
        direct_url = info / "direct_url.json"
        direct = json.loads(direct_url.read_text(encoding="utf-8")) if direct_url.exists() \
            else {}
        if direct.get("dir_info", {}).get("editable"):
            return None
        import csv

        table: dict[str, tuple[str, int]] = {}
        _installed[dist_name] = os.stat(info / "RECORD").st_ctime_ns
        with open(info / "RECORD", encoding="utf-8", newline="") as handle:
            for row in csv.reader(handle):
                if len(row) < 3 or not row[1] or not row[2]:
                    continue
                mode, _, value = row[1].partition("=")
                if mode != "sha256":
                    continue
                raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
                table[os.path.realpath(info.parent / row[0])] = (raw.hex(), int(row[2]))
        return table
    except (OSError, ValueError, AttributeError, TypeError):
        return False


def _record_hashes(dist_name: str) -> dict[str, tuple[str, int]] | None:
    if dist_name in _records:
        return _records[dist_name]
    read = _read_record(dist_name)
    if read is not False:
        _records[dist_name] = read  # type: ignore[assignment]
        return _records[dist_name]
    from importlib import metadata

    table: dict[str, tuple[str, int]] | None = None
    try:
        dist = metadata.distribution(dist_name)
        direct = json.loads(dist.read_text("direct_url.json") or "{}")
        if not direct.get("dir_info", {}).get("editable"):
            table = {}
            for entry in dist.files or ():
                if entry.name == "RECORD" and entry.parent.name.endswith(".dist-info"):
                    _installed[dist_name] = os.stat(entry.locate()).st_ctime_ns
                if entry.hash is None or entry.hash.mode != "sha256" or entry.size is None:
                    continue
                raw = base64.urlsafe_b64decode(entry.hash.value + "=" * (-len(entry.hash.value)
                                                                        % 4))
                table[os.path.realpath(entry.locate())] = (raw.hex(), entry.size)
    except (metadata.PackageNotFoundError, ValueError, OSError):
        table = None
    _records[dist_name] = table
    return table


def unit_of(module_name: str) -> str:
    """The code unit (top-level package or module) a module belongs to."""
    return module_name.split(".", 1)[0]


def _unit_files(unit: str) -> tuple[Path, list[Path]] | None:
    """(base directory, files) of a unit; None if it has no source files."""
    module = sys.modules.get(unit)
    origin: str | None = getattr(module, "__file__", None) if module is not None else None
    locations = list(getattr(module, "__path__", []) or []) if module is not None else []
    if module is None:
        try:
            spec = importlib.util.find_spec(unit)
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            return None
        origin = spec.origin if spec.has_location else None
        locations = list(spec.submodule_search_locations or [])
    if locations:
        files: list[Path] = []
        for location in locations:
            for directory, subdirs, names in os.walk(location):
                subdirs[:] = sorted(d for d in subdirs if d not in _SKIP_DIRS)
                files.extend(Path(directory) / n for n in sorted(names)
                             if not n.endswith((".pyc", ".pyo")))
        return Path(locations[0]).parent, files
    if origin:
        return Path(origin).parent, [Path(origin)]
    return None


def drop_stale_bytecode(source: str, st: os.stat_result) -> None:
    """Delete ``source``'s cached bytecode when Python would run it although the file
    changed after it was written. Python trusts a ``.pyc`` whose header names the
    source's size and mtime in whole seconds, so an edit that keeps the size within the
    second the ``.pyc`` was written (a rule file saved twice, ``one`` to ``two``) runs
    the old code under a key made from the new: a wrong artifact. A ``.pyc`` written
    after the source's last change (a later mtime) is kept; one written in the same
    clock tick or before is dropped, and the next import compiles the source."""
    try:
        cached = importlib.util.cache_from_source(source)
        cached_st = os.stat(cached)
    except (OSError, ValueError, NotImplementedError):
        return
    if cached_st.st_mtime_ns > st.st_mtime_ns:
        return
    try:
        with open(cached, "rb") as f:
            header = f.read(16)
        if len(header) < 16 or int.from_bytes(header[4:8], "little") != 0:
            return  # a hash-based .pyc: Python checks it by the source's content
        if (int.from_bytes(header[8:12], "little") == (int(st.st_mtime) & 0xFFFFFFFF)
                and int.from_bytes(header[12:16], "little") == (st.st_size & 0xFFFFFFFF)):
            os.unlink(cached)
    except OSError:
        pass


class CodeDigests:
    """Digests of code units for one command, hashing through the stat memo."""

    def __init__(self, digests: SourceDigests, dists: Iterable[str] = ()) -> None:
        self._digests = digests
        self._dists = list(dict.fromkeys([ENGINE_UNIT, *dists]))
        self._units: dict[str, tuple[str, dict[str, str]]] = {}
        self.files_read: set[str] = set()

    def add_dist(self, dist: str) -> None:
        if dist not in self._dists:
            self._dists.append(dist)

    def _file_digest(self, path: Path) -> str:
        real = os.path.realpath(path)
        st = os.stat(real)
        for dist in self._dists:
            record = (_record_hashes(dist) or {}).get(real)
            installed = _installed.get(dist)
            if record is not None and record[1] == st.st_size and installed is not None \
                    and st.st_ctime_ns < installed:
                return record[0]
        if real.endswith(".py"):
            drop_stale_bytecode(real, st)
        return self._digests.digest(path)[0]

    def unit(self, unit: str) -> tuple[str, dict[str, str]]:
        """(digest, {relative file: digest}) of one unit; memoised for the command."""
        known = self._units.get(unit)
        if known is not None:
            return known
        found = _unit_files(unit)
        files: dict[str, str] = {}
        if found is not None:
            base, paths = found
            for path in paths:
                try:
                    files[path.relative_to(base).as_posix()] = self._file_digest(path)
                except OSError:
                    continue
                self.files_read.add(str(path))
        blob = json.dumps(files, sort_keys=True) if files else f"no source files: {unit}"
        result = (hashlib.sha256(blob.encode()).hexdigest(), files)
        self._units[unit] = result
        return result

    def files_of(self, digest: str) -> dict[str, str] | None:
        """The per-file digests of a unit digested by this command, by its digest."""
        for known, files in self._units.values():
            if known == digest:
                return files
        return None

    def units_for(self, rule_cls: type | None, refs: Iterable[str], pm: Any = None
                  ) -> list[str]:
        """The units a rule's action depends on: its classes' modules (unless
        ``rule_cls`` is None: a v2 action names its function instead), the engine, and
        the modules or hook implementers it names."""
        units = {ENGINE_UNIT}
        for cls in rule_cls.__mro__ if rule_cls is not None else ():
            if cls.__module__ not in ("builtins",):
                units.add(unit_of(cls.__module__))
        for ref in refs:
            if ref.startswith("hook:"):
                caller = getattr(pm.hook, ref[5:], None) if pm is not None else None
                for impl in caller.get_hookimpls() if caller is not None else ():
                    name = getattr(impl.plugin, "__name__", None) or type(impl.plugin).__module__
                    units.add(unit_of(name))
            else:
                units.add(unit_of(ref.split(":", 1)[0].strip()))
        return sorted(u for u in units if u)
