"""Every error qbuild reports to a user, and the exit code each one maps to.

    QbuildError                 base: one clear message, no traceback unless --verbose
    ├── UsageError              bad command line (exit 2)
    ├── ConfigError             bad workspace, BUILD file, label, attribute, graph (exit 2)
    │   └── PluginError         a plugin that cannot be loaded or clashes with another (exit 2)
    ├── RuleError               a rule refused its inputs while running (exit 1)
    ├── CacheError              the cache cannot be read or written (exit 1)
    └── BuildFailed             one or more actions failed (exit 1)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


class QbuildError(Exception):
    """An error with a user-facing message naming where it happened.

    Args:
        message: what is wrong and, where possible, what to do about it.
        file: the file the error is in (a BUILD file, a model, a dataset).
        target: the label of the target concerned.
        attr: the attribute concerned.
        line, column: position in ``file`` when known.
    """

    exit_code = 2

    def __init__(
        self,
        message: str,
        *,
        file: str | Path | None = None,
        target: str | None = None,
        attr: str | None = None,
        line: int | None = None,
        column: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.file = str(file) if file is not None else None
        self.target = target
        self.attr = attr
        self.line = line
        self.column = column

    # Keep the location fields across process boundaries.
    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.message, dict(self.__dict__)))

    def located(self, **where: object) -> QbuildError:
        """Fill in location fields that are still unknown; returns self."""
        for name, value in where.items():
            if value is not None and getattr(self, name, None) is None:
                setattr(self, name, str(value) if name == "file" else value)
        return self

    def __str__(self) -> str:
        parts = []
        if self.file:
            pos = self.file
            if self.line is not None:
                pos += f":{self.line}"
                if self.column is not None:
                    pos += f":{self.column}"
            parts.append(pos)
        if self.target:
            parts.append(f"target {self.target}")
        if self.attr:
            parts.append(f"attribute '{self.attr}'")
        where = ", ".join(parts)
        return f"{where}: {self.message}" if where else self.message


class UsageError(QbuildError):
    """The command line is wrong."""

    exit_code = 2


class ConfigError(QbuildError):
    """The workspace, a BUILD file, a label or the target graph is wrong."""

    exit_code = 2


class PluginError(ConfigError):
    """A plugin cannot be loaded, or two plugins provide the same rule kind."""


class RuleError(QbuildError):
    """Raised by a rule while running, for bad inputs it was given."""

    exit_code = 1


class BuildFailed(QbuildError):
    """The build ran but at least one action failed."""

    exit_code = 1


class CacheError(QbuildError):
    """The cache cannot be read or written (full disk, read-only, locked)."""

    exit_code = 1


def _rebuild(cls: type[QbuildError], message: str, state: dict[str, Any]) -> QbuildError:
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    error.__dict__.update(state)
    return error
