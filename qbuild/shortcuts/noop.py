"""The no-op fast path: answer "nothing changed" from stat calls alone.

After a fully successful ``qbuild build``, a snapshot records the stats the full path
itself used: ``qbuild.toml`` and every BUILD file as stat'ed just before parsing, every
directory a glob or package walk listed (and those it skipped for holding a nested
workspace), every source file as stat'ed when its digest was taken, the identity
(lstat device and inode) of every folder from the root down to each source (so one
swapped for a symlink is seen), every materialized output as placed, every Python
module file the process had loaded (qbuild, the plugins), the ``sys.path`` fingerprint
(installing or upgrading any distribution, e.g. onnxruntime, changes it) and the
interpreter. When a later build with the same patterns from the same
directory finds every one of those stats unchanged, every action key is necessarily
unchanged and every output is in place, so it prints the same result without loading
plugins, parsing BUILD files or opening the cache.

Paths inside the workspace are stored relative to its root, so a copy of the workspace
checks its own files. A file whose timestamps are not safely older than the start of the
build (by the filesystem's timestamp granularity) may have changed after it was read
without its stat showing it: then no snapshot is written and the next build takes the
full path. Anything else the snapshot cannot vouch for (``--explain``, an event log)
takes the full path too.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..analysis.reads import folder_identities, same_folders
from ..core.files import key_is_racy
from ..keys import environ
from ..keys.machine import machine_facts

_VERSION = 4


def _stat(path: str) -> str | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def environment(options: str = "") -> dict[str, Any]:
    """The interpreter and ``sys.path`` fingerprint, plus ``options`` (a digest of the
    command-line settings that change what a build does, such as the remote cache);
    take it when the build starts."""
    paths = []
    for entry in sys.path:
        paths.append([entry, _stat(entry or ".")])
    return {"version": _VERSION, "python": sys.executable, "sys_path": paths,
            "cache_env": os.environ.get("QBUILD_CACHE_DIR", ""), "options": options,
            # keyed by the command rule (target_env): a change must take the full path
            "path_env": [os.environ.get("PATH", ""), os.environ.get("LANG", "")],
            # keyed by machine-dependent rules (QBUILD_MACHINE_CLASS or the CPU's flags)
            "machine": machine_facts()}


def with_reads(env: Mapping[str, Any]) -> dict[str, Any]:
    """``env`` (an ``environment()``) plus the environment variables the keys' facts
    were read from in this process (``keys.environ``): what a shortcut records."""
    return {**env, "environ": environ.reads()}


def same_environment(recorded: Any, env: Mapping[str, Any]) -> bool:
    """Is ``recorded`` (a ``with_reads``) what the full path would key with now, given
    this build's ``environment()``: the same facts, every variable read unchanged?"""
    if not isinstance(recorded, dict) or not isinstance(recorded.get("environ"), dict):
        return False
    facts = dict(recorded)
    return environ.unchanged(facts.pop("environ")) and facts == env


def snapshot_file(output_dir: Path, patterns: Iterable[str], package: str | None) -> Path:
    request = json.dumps([sorted(patterns), package])
    name = hashlib.sha256(request.encode()).hexdigest()[:24]
    return output_dir / ".qbuild" / "noop" / f"{name}.json"


def _where(root: Path, name: str) -> str:
    return name if os.path.isabs(name) else os.path.join(root, name)


def try_noop(root: Path, output_dir: Path, patterns: list[str], package: str | None,
             options: str = "", toolchain_mismatch: str = "error") -> dict[str, Any] | None:
    """The recorded result if nothing it depends on changed, else None.

    A build that had ``[toolchain]`` mismatches (allowed by ``--toolchain_mismatch=warn``)
    answers only under ``warn`` too, its warnings in the summary's ``warnings`` (to be
    printed again): the pins and installed versions are unchanged (``qbuild.toml`` and
    the ``sys.path`` fingerprint), so are the mismatches, and the full path would stop."""
    path = snapshot_file(output_dir, patterns, package)
    try:
        snapshot = json.loads(path.read_text(encoding="utf-8"))
        if not same_environment(snapshot.get("environment"), environment(options)):
            return None
        for name, key in snapshot["files"].items():
            if _stat(_where(root, name)) != key:
                return None
        if not same_folders(root, snapshot["folders"]):
            return None
        if not (isinstance(snapshot["lines"], list) and isinstance(snapshot["summary"], dict)
                and all(isinstance(line, str) for line in snapshot["lines"])):
            return None
        int(snapshot["summary"]["targets"]), int(snapshot["summary"]["actions"])
        warnings = snapshot["summary"].setdefault("warnings", [])
        if not (isinstance(warnings, list) and all(isinstance(w, str) for w in warnings)):
            return None
        if warnings and toolchain_mismatch != "warn":
            return None
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None  # absent or damaged: the full path decides
    return dict(snapshot)


def record(root: Path, output_dir: Path, patterns: list[str], package: str | None, *,
           reads: Mapping[str, str | None], outputs: Mapping[str, str], started: float,
           env: dict[str, Any], lines: list[str], summary: dict[str, Any],
           code_files: Iterable[str] = (), sources: Iterable[str] = ()) -> bool:
    """Write the snapshot of a successful build (best effort); False if refused.

    ``reads`` are the stats the build took as it read things (names relative to
    ``root`` or absolute); ``outputs`` the stats of the outputs it placed itself.
    ``started`` is the wall-clock time the build started; ``sources`` the source files
    the actions read (every folder on their way must stay the same real folder)."""
    folders = folder_identities(root, sources)
    if folders is None:
        return False
    files: dict[str, str | None] = dict(reads)
    for file in code_files:  # rule code hashed for the keys (stat-checked, never re-read)
        files.setdefault(file, _stat(file))
    for module in list(sys.modules.values()):
        module_file: str | None = getattr(module, "__file__", None)
        if module_file:
            file = module_file
            name = os.path.relpath(file, root) if file.startswith(str(root) + os.sep) else file
            files.setdefault(name, _stat(file))
    for key in files.values():
        if key is not None and key_is_racy(key, started):
            return False  # touched after the build started (or too close to tell)
    files.update(outputs)
    path = snapshot_file(output_dir, patterns, package)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        temp.write_text(json.dumps({"environment": with_reads(env), "files": files,
                                    "folders": folders, "lines": lines, "summary": summary}),
                        encoding="utf-8")
        os.replace(temp, path)
    except OSError:
        return False
    return True


def forget(output_dir: Path, patterns: list[str], package: str | None) -> None:
    """Drop the snapshot for this request (a build that did not succeed)."""
    try:
        snapshot_file(output_dir, patterns, package).unlink()
    except OSError:
        pass
