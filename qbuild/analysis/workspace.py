"""The workspace: its root (marked by ``qbuild.toml``), its settings, and where things live.

``qbuild.toml`` at the root marks the workspace and holds settings::

    [settings]
    cache_dir = "~/.cache/qbuild"   # content-addressed store and action cache
    jobs = 2                        # default parallelism (default: CPU count)
    output_dir = "qbuild-out"       # where requested targets' files appear
    plugins = ["no:NAME"]           # plugins not to load (like the -p no:NAME flag)

    [toolchain]                     # versions that change artifacts (see _toolchain)
    onnxruntime = "1.31.1"

Relative ``cache_dir`` values are relative to the root. ``QBUILD_CACHE_DIR`` in the
environment overrides the setting (CI uses it to point at a restored cache).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..core.errors import ConfigError
from ..core.files import stat_key
from ..core.toml import load_toml

MARKER = "qbuild.toml"
BUILD_FILE = "BUILD.toml"
_KNOWN_SETTINGS = {"cache_dir", "jobs", "output_dir", "plugins"}


@dataclass(frozen=True)
class Workspace:
    """A workspace root and its resolved settings."""

    root: Path
    cache_dir: Path
    jobs: int
    output_dir: Path
    # Pinned distribution versions from [toolchain], sorted (name, version) pairs.
    toolchain: tuple[tuple[str, str], ...] = ()
    # Plugins not to load ([settings] plugins = ["no:NAME"]).
    blocked_plugins: tuple[str, ...] = ()
    # Stat key of qbuild.toml taken before it was read (for the no-op fast path).
    marker_stat: str | None = field(default=None, compare=False)
    # Does qbuild.toml have a [remote] table? (Without one, and without a flag or
    # $QBUILD_REMOTE_CACHE, no remote cache code is even imported.)
    has_remote: bool = field(default=False, compare=False)

    def package_of(self, directory: Path) -> str:
        """The package path of ``directory`` relative to the root ('' for the root)."""
        rel = directory.resolve().relative_to(self.root)
        return rel.as_posix() if rel.parts else ""


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "qbuild"


def find_root(start: Path) -> Path:
    """Walk up from ``start`` to the directory holding ``qbuild.toml``."""
    here = start.resolve()
    for directory in (here, *here.parents):
        if (directory / MARKER).is_file():
            return directory
    raise ConfigError(
        f"not inside a qbuild workspace: no {MARKER} in {here} or any parent "
        f"(create an empty {MARKER} at your project's root)"
    )


def load_workspace(start: Path) -> Workspace:
    """Find the workspace containing ``start`` and read its settings."""
    root = find_root(start)
    marker = root / MARKER
    try:
        marker_stat: str | None = stat_key(os.stat(marker))
    except OSError:
        marker_stat = None
    data = load_toml(marker)
    settings = data.get("settings", {})
    if not isinstance(settings, dict):
        raise ConfigError("[settings] must be a table", file=marker)
    unknown = sorted(set(settings) - _KNOWN_SETTINGS)
    if unknown:
        raise ConfigError(
            f"unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(_KNOWN_SETTINGS))}",
            file=marker,
        )
    cache_setting = os.environ.get("QBUILD_CACHE_DIR") or settings.get("cache_dir")
    if cache_setting is None:
        cache_dir = default_cache_dir()
    elif isinstance(cache_setting, str):
        cache_dir = root / os.path.expanduser(cache_setting)
    else:
        raise ConfigError("setting 'cache_dir' must be a string", file=marker)
    jobs = settings.get("jobs", os.cpu_count() or 1)
    if not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1:
        raise ConfigError("setting 'jobs' must be a positive integer", file=marker)
    output = settings.get("output_dir", "qbuild-out")
    if not isinstance(output, str) or not output or Path(output).is_absolute() or ".." in Path(
        output
    ).parts:
        raise ConfigError("setting 'output_dir' must be a relative path inside the workspace",
                          file=marker)
    for name, folder in (("cache_dir", cache_dir), ("output_dir", root / output)):
        if folder.exists() and not folder.is_dir():
            raise ConfigError(f"setting '{name}' points at {folder}, which is not a folder",
                              file=marker)
    toolchain = data.get("toolchain", {})
    if not isinstance(toolchain, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and v.strip() for k, v in toolchain.items()):
        raise ConfigError("[toolchain] must map distribution names to version strings, e.g. "
                          'onnxruntime = "1.31.1"', file=marker)
    workspace = Workspace(root=root, cache_dir=cache_dir.resolve(), jobs=jobs,
                          output_dir=root / output, marker_stat=marker_stat,
                          has_remote="remote" in data,
                          toolchain=tuple(sorted(toolchain.items())),
                          blocked_plugins=blocked_plugins(settings.get("plugins", []), marker))
    check_ownership(workspace, marker)
    return workspace


def blocked_plugins(values: object, where: Path | None = None) -> tuple[str, ...]:
    """The names in ``["no:NAME", ...]`` (the ``plugins`` setting and ``-p`` flags)."""
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise ConfigError('setting \'plugins\' must be a list like ["no:NAME"]', file=where)
    names = []
    for value in values:
        name = value.strip().removeprefix("no:")
        if not value.strip().startswith("no:") or not name:
            raise ConfigError(f"plugin option {value!r}: only 'no:NAME' (do not load the "
                              "plugin NAME) is known", file=where)
        names.append(name)
    return tuple(names)


OWNED_MARKER = ".qbuild"  # in the output folder: qbuild made it, so qbuild may delete in it
CACHE_ENTRIES = ("ac", "cas", "memo", "tmp", "locks", "entry_points.json")


def _non_empty(path: Path) -> bool:
    try:
        with os.scandir(path) as entries:
            return any(True for _ in entries)
    except (NotADirectoryError, FileNotFoundError):
        return path.exists() or path.is_symlink()
    except OSError:
        return True


def check_ownership(workspace: Workspace, marker: Path) -> None:
    """Refuse output and cache folders whose deletion would take files qbuild does not
    own: the workspace itself, a folder holding it, or an existing folder of other files.
    """
    root, output, cache = workspace.root, workspace.output_dir, workspace.cache_dir
    if output.resolve() == root.resolve():
        raise ConfigError("setting 'output_dir' names the workspace root; qbuild deletes "
                          "stale files there: use a folder of its own such as 'qbuild-out'",
                          file=marker)
    if _non_empty(output) and not (output / OWNED_MARKER).is_dir():
        raise ConfigError(f"setting 'output_dir': {output.relative_to(root).as_posix()}/ "
                          f"exists and was not made by qbuild (no {OWNED_MARKER} in it); "
                          "qbuild deletes stale files in its output folder: name a new one",
                          file=marker)
    if root.resolve().is_relative_to(cache) or cache.is_relative_to(output.resolve()):
        raise ConfigError(f"setting 'cache_dir' ({cache}) holds the workspace or lies in "
                          "the output folder; use a folder of its own", file=marker)
    if _non_empty(cache) and not any((cache / name).exists() for name in CACHE_ENTRIES):
        raise ConfigError(f"setting 'cache_dir' ({cache}) names an existing folder that is "
                          "not a qbuild cache; name a new or empty folder", file=marker)


def claim_output_dir(output_dir: Path) -> None:
    """Create the output folder with the marker that lets later commands delete in it."""
    (output_dir / OWNED_MARKER).mkdir(parents=True, exist_ok=True)
