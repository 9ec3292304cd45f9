"""Version facts: qbuild's own version and the installed version of any distribution.

They live here, not in ``qbuild/__init__``, so every layer can read them without
importing the top-level package."""

from __future__ import annotations

__version__ = "0.2.0"

_versions: dict[str, str] = {}


def dist_version(distribution: str) -> str:
    """The installed version of a distribution ("absent" if not installed), without
    importing it: for ``Rule.env()`` facts such as the onnxruntime version."""
    version = _versions.get(distribution)
    if version is None:
        from importlib import metadata

        try:
            version = metadata.version(distribution)
        except metadata.PackageNotFoundError:
            version = "absent"
        _versions[distribution] = version
    return version
