"""The no-op fast path: answer "nothing changed" from stat calls alone.

After a fully successful ``qbuild build``, a snapshot records the stat of everything the
result depended on: ``qbuild.toml``, every BUILD file read, every directory walked or
globbed, every source file, every materialized output, and every Python module file the
process had loaded (qbuild, the plugins), plus the ``sys.path`` fingerprint (installing
or upgrading any distribution, e.g. onnxruntime, changes it) and the interpreter. When a
later build with the same patterns from the same directory finds every one of those
stats unchanged, every action key is necessarily unchanged and every output is in place,
so it prints the same result without loading plugins, parsing BUILD files or opening
the cache. Any difference, or anything the snapshot cannot vouch for (``**`` globs,
``--explain``, an event log), takes the full path.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

_VERSION = 1


def _stat(path: str) -> str | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def _environment() -> dict[str, Any]:
    paths = []
    for entry in sys.path:
        paths.append([entry, _stat(entry or ".")])
    return {"version": _VERSION, "python": sys.executable, "sys_path": paths,
            "cache_env": os.environ.get("QBUILD_CACHE_DIR", ""),
            # keyed by the command rule (target_env): a change must take the full path
            "path_env": [os.environ.get("PATH", ""), os.environ.get("LANG", "")]}


def snapshot_file(output_dir: Path, patterns: Iterable[str], package: str | None) -> Path:
    request = json.dumps([sorted(patterns), package])
    name = hashlib.sha256(request.encode()).hexdigest()[:24]
    return output_dir / ".qbuild" / "noop" / f"{name}.json"


def try_noop(output_dir: Path, patterns: list[str], package: str | None
             ) -> dict[str, Any] | None:
    """The recorded result if nothing it depends on changed, else None."""
    path = snapshot_file(output_dir, patterns, package)
    try:
        snapshot = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if snapshot.get("environment") != _environment():
        return None
    for file, key in snapshot["files"].items():
        if _stat(file) != key:
            return None
    return snapshot


def record(output_dir: Path, patterns: list[str], package: str | None,
           files: Iterable[str], lines: list[str], summary: dict[str, Any]) -> None:
    """Write the snapshot of a successful build (best effort)."""
    watched = set(files)
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if file:
            watched.add(file)
    stats = {}
    for file in sorted(watched):
        key = _stat(file)
        if key is None:
            return
        stats[file] = key
    path = snapshot_file(output_dir, patterns, package)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        temp.write_text(json.dumps({"environment": _environment(), "files": stats,
                                    "lines": lines, "summary": summary}), encoding="utf-8")
        os.replace(temp, path)
    except OSError:
        pass
