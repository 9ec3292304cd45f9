"""Workspace toolchain pins: the library versions a workspace's artifacts were made with.

``qbuild.toml`` may pin the distributions that change artifacts::

    [toolchain]
    onnxruntime = "1.31.1"    # exactly this version
    onnx = "1.23.*"           # any 1.23 release

A build under other installed versions stops with one message naming each mismatch
(exit 2) unless ``--toolchain_mismatch=warn``: the same BUILD files must give the same
artifacts, as Bazel's registered toolchains do. Versions are read from installed
distributions' metadata, never by importing them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from ..core.errors import ConfigError

MODES = ("error", "warn")


def matches(installed: str, pinned: str) -> bool:
    """True if ``installed`` satisfies ``pinned`` ("1.2.3", "==1.2.3" or "1.2.*")."""
    want = pinned.strip().removeprefix("==").strip()
    if want.endswith(".*"):
        prefix = want[:-2]
        return installed == prefix or installed.startswith(prefix + ".")
    return installed == want


def mismatches(pins: Mapping[str, str]) -> list[str]:
    """One line per pinned distribution whose installed version does not match."""
    from ..core.versions import dist_version

    out = []
    for dist, pinned in sorted(pins.items()):
        installed = dist_version(dist)
        if installed == "absent":
            out.append(f"{dist} {pinned} is pinned but not installed")
        elif not matches(installed, pinned):
            out.append(f"{dist} {installed} is installed, {pinned} is pinned")
    return out


def check(pins: Mapping[str, str], mode: str, marker: str | Path,
          warn: Callable[[str], None]) -> None:
    """Raise ConfigError (or ``warn`` each line) when installed versions differ from pins."""
    found = mismatches(pins)
    if not found:
        return
    if mode == "warn":
        for line in found:
            warn(f"warning: toolchain mismatch: {line} (artifacts may differ from the "
                 f"pinned toolchain's)")
        return
    raise ConfigError("toolchain mismatch: " + "; ".join(found) + " (install the pinned "
                      "versions, e.g. pip install -r requirements.lock, or pass "
                      "--toolchain_mismatch=warn)", file=marker)
