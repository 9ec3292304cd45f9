"""Typed attribute schemas for rules: what a BUILD.toml key may hold, its default and help.

Rules declare ``attrs = {"name": attr.int(default=3, doc="...")}``; the loader checks
every value against its schema and applies defaults, so a rule's ``run`` only ever sees
well-typed values, and the action key covers every attribute after defaults.
"""

from __future__ import annotations

import builtins  # annotations inside ``attr``, whose methods shadow bool, int, float
import datetime
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.errors import ConfigError

_REQUIRED = object()

_TYPE_NAMES = {
    "label": "label",
    "label_list": "list of labels",
    "file": "file (path relative to the package, or a label)",
    "files": "list of files (globs allowed) or labels",
    "string": "string",
    "int": "integer",
    "float": "number",
    "bool": "boolean",
    "enum": "one of",
    "string_list": "list of strings",
    "int_list": "list of integers",
    "float_list": "list of numbers",
    "mapping": "table",
}


def _list_hint(kind: str, value: Any) -> str:
    """Advice for a lone value where a list is declared: the value in brackets, or for a
    number list written as text (``"224x224"``) the numbers it holds."""
    if kind in ("int_list", "float_list"):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return f" (write [{json.dumps(value)}])"
        if isinstance(value, str):
            numbers = re.findall(r"-?\d+(?:\.\d+)?" if kind == "float_list" else r"-?\d+",
                                 value)
            return f" (write [{', '.join(numbers)}])" if numbers else ""
        return ""
    return f" (write [{json.dumps(value)}])" if isinstance(value, str) else ""


def _type_word(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a table"
    return type(value).__name__


def _plain(value: Any) -> Any:
    """TOML values as JSON-compatible data (dates become ISO strings)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    return value


@dataclass(frozen=True)
class Attr:
    """One attribute's schema. Build instances with the ``attr.*`` constructors."""

    type: str
    doc: str = ""
    default: Any = None
    required: bool = False
    values: tuple[str, ...] = field(default=())
    # Applies only when each named attribute has one of the listed values, e.g.
    # (("method", ("percentile",)),); otherwise it keeps its default, out of the key.
    when: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    # For ``files``: a folder expands to the files directly in it with these suffixes
    # (any suffix if empty); None refuses folders.
    folder_suffixes: tuple[str, ...] | None = None
    # For ``label``/``label_list``: provider classes every dependency must give,
    # checked at analysis against the dependency rule's ``provides``.
    providers: tuple[builtins.type, ...] = ()
    # For ``label``/``label_list``: a dependency that fails (or is skipped) does not fail
    # this target; its action gets the dependency with ``Dep.failed`` set (``_plan``).
    tolerate_failures: builtins.bool = False

    def applies(self, values: Mapping[str, Any]) -> bool:
        """Whether this attribute applies given the target's other attribute values."""
        return all(values.get(name) in allowed for name, allowed in self.when)

    def describe_when(self) -> str:
        """``only when method is 'percentile'``, or "" when it always applies."""
        parts = []
        for name, allowed in self.when:
            shown = " or ".join(json.dumps(v) if isinstance(v, bool) else repr(v)
                                for v in allowed)
            parts.append(f"{name} is {shown}")
        return "only when " + " and ".join(parts) if parts else ""

    def type_name(self) -> str:
        name = _TYPE_NAMES[self.type]
        if self.type == "enum":
            return f"one of {', '.join(repr(v) for v in self.values)}"
        return name

    def is_dependency(self) -> bool:
        return self.type in ("label", "label_list", "file", "files")

    def check(self, value: Any) -> Any:
        """Return the canonical value, or raise ConfigError(message) (caller adds location)."""
        kind = self.type
        if kind in ("label", "file", "string"):
            if not isinstance(value, str):
                raise ConfigError(f"expected a {self.type_name()}, got {_type_word(value)}")
            if kind != "string" and not value:
                raise ConfigError(f"expected a {self.type_name()}, got an empty string")
            return value
        if kind == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"expected an integer, got {_type_word(value)}")
            return value
        if kind == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"expected a number, got {_type_word(value)}")
            return float(value)
        if kind == "bool":
            if not isinstance(value, bool):
                raise ConfigError(f"expected true or false, got {_type_word(value)}")
            return value
        if kind == "enum":
            if value not in self.values:
                raise ConfigError(
                    f"expected one of {', '.join(repr(v) for v in self.values)}, got {value!r}"
                )
            return value
        if kind == "mapping":
            if not isinstance(value, dict):
                raise ConfigError(f"expected a table, got {_type_word(value)}")
            return _plain(value)
        # list kinds: a lone value is refused (as Bazel does), so a typo cannot slip by
        if not isinstance(value, list):
            hint = _list_hint(kind, value)
            raise ConfigError(f"expected a {self.type_name()}, got {_type_word(value)}{hint}")
        element = {"label_list": "label", "files": "file", "string_list": "string",
                   "int_list": "int", "float_list": "float"}[kind]
        item_schema = Attr(element)
        out = []
        for index, item in enumerate(value):
            try:
                out.append(item_schema.check(item))
            except ConfigError as exc:
                raise ConfigError(f"item {index}: {exc.message}") from None
        return out

    def default_value(self) -> Any:
        if self.default is not None:
            # The same canonical form as a written value: float(default=1) gives 1.0.
            if self.type == "float":
                return float(self.default)
            if self.type == "float_list":
                return [float(v) for v in self.default]
            return _plain(self.default)
        if self.type in ("label_list", "files", "string_list", "int_list", "float_list"):
            return []
        if self.type == "mapping":
            return {}
        return None

    def describe_default(self) -> str:
        if self.required:
            return "required"
        return repr(self.default_value())


_When = Mapping[str, Sequence[Any]] | None


def _when(when: _When) -> tuple[tuple[str, tuple[Any, ...]], ...]:
    return tuple((name, tuple(allowed)) for name, allowed in (when or {}).items())


class attr:  # noqa: N801 - a namespace, used as ``attr.int(...)`` like Bazel's ``attr``
    """Constructors for attribute schemas. Each takes ``doc`` (help text) and ``default``
    (or ``required=True``). Value attributes also take ``when``: a mapping of other
    attributes to the values under which this one applies (``when={"method":
    ["percentile"]}``); otherwise it keeps its default and does not enter the key."""

    @staticmethod
    def label(*, doc: str = "", required: builtins.bool = False,
              providers: Sequence[builtins.type] = (),
              tolerate_failures: builtins.bool = False) -> Attr:
        """Another target (``:name`` or ``//pkg:name``); the rule gets a ``Dep``. With
        ``providers``, a target whose rule does not declare each of them is refused at
        analysis, before anything runs. With ``tolerate_failures``, a dependency that
        fails does not fail this target: the action gets a ``Dep`` whose ``failed`` is
        the one-line reason (and no files or providers); the build does not stop for it
        and, unless the user asked for the dependency itself, still succeeds."""
        return Attr("label", doc, None, required, providers=tuple(providers),
                    tolerate_failures=tolerate_failures)

    @staticmethod
    def label_list(*, doc: str = "", required: builtins.bool = False,
                   providers: Sequence[builtins.type] = (),
                   tolerate_failures: builtins.bool = False) -> Attr:
        """A list of targets; the rule gets ``list[Dep]``. ``providers`` and
        ``tolerate_failures`` as for ``label``, for every item."""
        return Attr("label_list", doc, None, required, providers=tuple(providers),
                    tolerate_failures=tolerate_failures)

    @staticmethod
    def file(*, doc: str = "", required: builtins.bool = False) -> Attr:
        """A source file relative to the package, or a label of a target with one output
        file; the rule gets a ``pathlib.Path``."""
        return Attr("file", doc, None, required)

    @staticmethod
    def files(*, doc: str = "", required: builtins.bool = False,
              folders: Sequence[str] | None = None) -> Attr:
        """Source files (glob patterns allowed, expanded in sorted order) or labels; the
        rule gets ``list[Path]``. With ``folders`` (suffixes such as ``[".jpg"]``, or
        ``[]`` for any), a folder stands for the files directly in it, sorted."""
        suffixes = None if folders is None else tuple(s.lower() for s in folders)
        return Attr("files", doc, None, required, folder_suffixes=suffixes)

    @staticmethod
    def string(*, default: str | None = None, doc: str = "", required: builtins.bool = False,
               when: _When = None) -> Attr:
        return Attr("string", doc, default, required, when=_when(when))

    @staticmethod
    def int(*, default: builtins.int | None = None, doc: str = "", required: builtins.bool = False,
            when: _When = None) -> Attr:
        return Attr("int", doc, default, required, when=_when(when))

    @staticmethod
    def float(*, default: builtins.float | None = None, doc: str = "",
              required: builtins.bool = False, when: _When = None) -> Attr:
        return Attr("float", doc, default, required, when=_when(when))

    @staticmethod
    def bool(*, default: builtins.bool | None = None, doc: str = "",
             required: builtins.bool = False, when: _When = None) -> Attr:
        return Attr("bool", doc, default, required, when=_when(when))

    @staticmethod
    def enum(
        values: Sequence[str], *, default: str | None = None, doc: str = "",
        required: builtins.bool = False, when: _When = None,
    ) -> Attr:
        if default is not None and default not in values:
            raise ValueError(f"enum default {default!r} is not one of {list(values)}")
        return Attr("enum", doc, default, required, tuple(values), when=_when(when))

    @staticmethod
    def string_list(*, default: list[str] | None = None, doc: str = "",
                    required: builtins.bool = False, when: _When = None) -> Attr:
        return Attr("string_list", doc, default, required, when=_when(when))

    @staticmethod
    def int_list(*, default: list[builtins.int] | None = None, doc: str = "",
                 required: builtins.bool = False, when: _When = None) -> Attr:
        return Attr("int_list", doc, default, required, when=_when(when))

    @staticmethod
    def float_list(*, default: list[builtins.float] | None = None, doc: str = "",
                   required: builtins.bool = False, when: _When = None) -> Attr:
        return Attr("float_list", doc, default, required, when=_when(when))

    @staticmethod
    def mapping(*, default: dict[str, Any] | None = None, doc: str = "",
                required: builtins.bool = False, when: _When = None) -> Attr:
        """A free-form TOML table (JSON-like values)."""
        return Attr("mapping", doc, default, required, when=_when(when))
