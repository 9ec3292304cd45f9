"""Reading TOML files with errors that name the file, line and column."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from .errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

_POSITION = re.compile(r"\(at line (\d+), column (\d+)\)")


def load_toml(path: Path, shown_as: str | None = None) -> dict[str, Any]:
    """Parse ``path``; a syntax error becomes a ConfigError with line and column."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror}", file=shown_as or path) from None
    try:
        loaded: dict[str, Any] = tomllib.loads(data.decode("utf-8"))
        return loaded
    except UnicodeDecodeError:
        raise ConfigError("not UTF-8 text", file=shown_as or path) from None
    except RecursionError:
        raise ConfigError("values nested too deeply", file=shown_as or path) from None
    except tomllib.TOMLDecodeError as exc:
        text = str(exc)
        match = _POSITION.search(text)
        line = int(match.group(1)) if match else None
        column = int(match.group(2)) if match else None
        if match is None and "(at end of document)" in text:
            decoded = data.decode("utf-8")
            line = decoded.count("\n") + 1
            column = len(decoded.rsplit("\n", 1)[-1]) + 1
        message = _POSITION.sub("", text).replace("(at end of document)", "").strip()
        raise ConfigError(
            f"TOML syntax error: {message}", file=shown_as or path, line=line, column=column
        ) from None
