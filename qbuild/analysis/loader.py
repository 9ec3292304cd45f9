"""Finding and parsing ``BUILD.toml`` files into target specs, with matrix expansion.

A BUILD.toml holds one table per target::

    [yolo_int8]
    rule = "quantize"
    model = ":yolo_pre"
    matrix = { per_channel = [true, false], method = ["minmax", "entropy"] }

A ``matrix`` expands the table into one ordinary target per combination, labelled
``yolo_int8@per_channel=true,method=minmax`` and so on (keys in the order written), and
makes ``yolo_int8`` itself a group of all variants. In a variant, ``{key}`` inside string
values is replaced by that variant's value, so dependent matrices can pair up. A matrix
key the rule declares becomes that attribute; any other key is only such a variable.

A *macro* rule (one whose class defines ``expand_targets``) adds ordinary targets to its
package when the package loads: ``expand_targets(name, raw)`` returns the extra tables
(named ``<name>.<suffix>``, each with its ``rule``) and the macro target's own raw
attributes, which may now refer to them. The extra targets are cached like any other, so
changing only an attribute the expansion does not pass on reruns only the macro target.
"""

from __future__ import annotations

import difflib
import hashlib
import itertools
import json
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.errors import ConfigError
from ..core.files import key_is_racy
from ..core.labels import Label, _check_name
from ..core.toml import load_toml
from .reads import Reads
from .workspace import BUILD_FILE, MARKER, Workspace

MATRIX_KIND = "matrix"
MAX_MATRIX_VARIANTS = 10_000
_SKIP_DIRS = {"__pycache__", "node_modules", "venv"}


@dataclass
class TargetSpec:
    """A target as written: label, rule kind, raw attributes and where it was declared."""

    label: Label
    kind: str
    raw: dict[str, Any]
    build_file: str
    variants: list[Label] = field(default_factory=list)
    matrix_keys: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()

    @property
    def manual(self) -> bool:
        """Tagged ``manual``: left out of ``//...`` and ``:all``, built only by name."""
        return "manual" in self.tags


def _format_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _substitute(value: Any, bindings: dict[str, str]) -> Any:
    if isinstance(value, str):
        for key, replacement in bindings.items():
            value = value.replace("{" + key + "}", replacement)
        return value
    if isinstance(value, list):
        return [_substitute(v, bindings) for v in value]
    if isinstance(value, dict):
        return {k: _substitute(v, bindings) for k, v in value.items()}
    return value


_TEMPLATE = re.compile(r"(?<![$])\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _unknown_template(value: Any, keys: dict[str, str]) -> str | None:
    """A ``{key}`` left in a matrix variant's values that looks meant for a matrix axis:
    inside a label, or close to an axis name (other braces, as in shell or awk code,
    are left alone)."""
    if isinstance(value, str):
        for match in _TEMPLATE.finditer(value):
            name = match.group(1)
            if name in keys or name == "name":
                continue
            if value.startswith((":", "//")) or difflib.get_close_matches(name, keys):
                return name
        return None
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) \
        else ()
    for item in items:
        found = _unknown_template(item, keys)
        if found:
            return found
    return None


def _tags(table: dict[str, Any], shown: str, label: Label) -> tuple[str, ...]:
    tags = table.get("tags", [])
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise ConfigError("'tags' must be a list of strings (e.g. tags = [\"manual\"])",
                          file=shown, target=str(label), attr="tags")
    return tuple(tags)


def _expand(package: str, name: str, table: dict[str, Any], shown: str) -> list[TargetSpec]:
    kind = table.get("rule")
    label = Label(package, name)
    if kind is None:
        raise ConfigError("missing 'rule' (the rule kind, e.g. rule = \"command\")",
                          file=shown, target=str(label))
    if not isinstance(kind, str):
        raise ConfigError("'rule' must be a string", file=shown, target=str(label), attr="rule")
    tags = _tags(table, shown, label)
    raw = {k: v for k, v in table.items() if k not in ("rule", "matrix", "tags")}
    matrix = table.get("matrix")
    if matrix is None:
        for attr_name, value in raw.items():
            unknown = _unknown_template(value, {})
            if unknown:
                raise ConfigError(f"'{{{unknown}}}' is a matrix template, but this target has "
                                  "no matrix", file=shown, target=str(label), attr=attr_name)
        return [TargetSpec(label, kind, raw, shown, tags=tags)]
    where: dict[str, Any] = {"file": shown, "target": str(label), "attr": "matrix"}
    if not isinstance(matrix, dict) or not matrix:
        raise ConfigError("'matrix' must be a non-empty table of lists", **where)
    axes = []
    combinations = 1
    for key, values in matrix.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"matrix axis '{key}' must be a non-empty list", **where)
        if key in raw:
            raise ConfigError(f"'{key}' is both an attribute and a matrix axis", **where)
        for value in values:
            if not isinstance(value, (str, int, float, bool)):
                raise ConfigError(f"matrix axis '{key}' values must be strings, numbers or "
                                  "booleans", **where)
        axes.append((key, values))
        combinations *= len(values)
    if combinations > MAX_MATRIX_VARIANTS:
        raise ConfigError(f"matrix of {combinations} variants; at most {MAX_MATRIX_VARIANTS} "
                          "per target (split it into several targets)", **where)
    specs = []
    group = TargetSpec(label, MATRIX_KIND, {}, shown, tags=tags)
    for combination in itertools.product(*(values for _, values in axes)):
        bindings = {key: _format_value(v) for (key, _), v in zip(axes, combination)}
        suffix = ",".join(f"{key}={text}" for key, text in bindings.items())
        variant_name = f"{name}@{suffix}"
        try:
            _check_name(variant_name, variant_name)
        except ConfigError:
            raise ConfigError(f"matrix values give an invalid target name '{variant_name}'",
                              **where) from None
        attrs = _substitute(raw, bindings)
        for attr_name, value in attrs.items():
            unknown = _unknown_template(value, bindings)
            if unknown:
                close = difflib.get_close_matches(unknown, bindings, 1)
                hint = f"; did you mean {{{close[0]}}}?" if close else ""
                raise ConfigError(f"'{{{unknown}}}' names no matrix key (matrix keys: "
                                  f"{', '.join(bindings)}){hint}", file=shown,
                                  target=str(label), attr=attr_name)
        attrs.update({key: v for (key, _), v in zip(axes, combination)})
        variant = Label(package, variant_name)
        specs.append(TargetSpec(variant, kind, attrs, shown,
                                matrix_keys=tuple(key for key, _ in axes), tags=tags))
        group.variants.append(variant)
    return [group, *specs]


MacroLookup = Callable[[str], Callable[[str, dict[str, Any]], Any] | None]


def _expand_macro(package: str, spec: TargetSpec, expander: Callable[..., Any], shown: str,
                  targets: dict[str, TargetSpec]) -> list[TargetSpec]:
    where: dict[str, Any] = {"file": shown, "target": str(spec.label)}
    try:
        extra, own = expander(spec.label.name, dict(spec.raw))
    except ConfigError as exc:
        raise exc.located(**where) from None
    spec.raw = own
    out = []
    for name, table in extra.items():
        if not name.startswith(spec.label.name + ".") or name in targets:
            raise ConfigError(f"macro generated a bad or clashing target name '{name}'",
                              **where)
        out.extend(_expand(package, name, table, shown))
    return out


class PackageLoader:
    """Loads packages lazily and remembers them for the rest of the command."""

    def __init__(self, workspace: Workspace, macros: MacroLookup | None = None) -> None:
        self.workspace = workspace
        self.macros = macros
        self._packages: dict[str, dict[str, TargetSpec]] = {}
        self.reads = Reads(workspace.root)  # what was read, for the no-op fast path

    def build_file(self, package: str) -> Path:
        return self.workspace.root / package / BUILD_FILE

    def shown_path(self, package: str) -> str:
        return f"{package}/{BUILD_FILE}" if package else BUILD_FILE

    def has_package(self, package: str) -> bool:
        return package in self._packages or self.build_file(package).is_file()

    def load(self, package: str) -> dict[str, TargetSpec]:
        """The targets of ``package``, by name. Raises ConfigError if it has no BUILD.toml."""
        cached = self._packages.get(package)
        if cached is not None:
            return cached
        path = self.build_file(package)
        shown = self.shown_path(package)
        key = self.reads.stat(path)
        if key is None or not path.is_file():
            raise ConfigError(f"no package '//{package}': {shown} does not exist")
        data = self._parsed(package, key)
        if data is None:
            data = load_toml(path, shown)
            self._remember(package, key, data)
        targets: dict[str, TargetSpec] = {}
        for name, table in data.items():
            if not isinstance(table, dict):
                raise ConfigError(f"top-level key '{name}' is not a target table "
                                  f"(write [{name}] with rule = \"...\")", file=shown)
            try:
                _check_name(name, name)
            except ConfigError as exc:
                raise ConfigError(f"bad target name '{name}': {exc.message}",
                                  file=shown) from None
            if "@" in name:
                raise ConfigError(f"bad target name '{name}': '@' is kept for matrix variants",
                                  file=shown)
            for spec in _expand(package, name, table, shown):
                targets[spec.label.name] = spec
        if self.macros is not None:
            for spec in list(targets.values()):
                expander = self.macros(spec.kind) if spec.kind != MATRIX_KIND else None
                if expander is not None:
                    for extra in _expand_macro(package, spec, expander, shown, targets):
                        targets[extra.label.name] = extra
        self._packages[package] = targets
        return targets

    # A BUILD file parsed before is read back from JSON (several times faster than
    # TOML), keyed by the stat it had; racy stats are never remembered.
    def _parsed_path(self, package: str) -> Path:
        name = hashlib.sha256(package.encode()).hexdigest()[:24]
        return self.workspace.output_dir / ".qbuild" / "parsed" / f"{name}.json"

    def _parsed(self, package: str, key: str) -> dict[str, Any] | None:
        try:
            record = json.loads(self._parsed_path(package).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(record, dict) or record.get("stat") != key:
            return None
        data = record.get("data")
        return data if isinstance(data, dict) else None

    def _remember(self, package: str, key: str, data: dict[str, Any]) -> None:
        if key_is_racy(key, time.time()) or not self.workspace.output_dir.is_dir():
            return
        path = self._parsed_path(package)
        try:
            text = json.dumps({"stat": key, "data": data}, allow_nan=True)
            if json.loads(text)["data"] != data:
                return  # a value JSON cannot hold as is
            path.parent.mkdir(parents=True, exist_ok=True)
            temp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
            temp.write_text(text, encoding="utf-8")
            os.replace(temp, path)
        except (OSError, TypeError, ValueError, RecursionError):
            pass

    def target(self, label: Label) -> TargetSpec | None:
        return self.load(label.package).get(label.name)

    def packages_under(self, package: str) -> Iterator[str]:
        """Every package at or below ``package``, in sorted order (skips hidden dirs,
        the output dir and nested workspaces)."""
        root = self.workspace.root
        start = root / package
        if not start.is_dir():
            raise ConfigError(f"no directory '{package}' in the workspace for '//{package}/...'")
        output_dir, cache_dir = self.workspace.output_dir, self.workspace.cache_dir
        found = []
        stack = [start]
        while stack:
            here = stack.pop()
            names = {entry.name: entry for entry in self.reads.listdir(here)}
            if BUILD_FILE in names:
                rel = here.relative_to(root).as_posix()
                found.append("" if rel == "." else rel)
            for name, entry in names.items():
                try:
                    if not entry.is_dir() or entry.is_symlink():
                        continue
                except OSError:
                    continue
                child = here / name
                if name.startswith(".") or name in _SKIP_DIRS or child in (output_dir, cache_dir):
                    continue
                # Skipped for what it holds: its own stat moves when that changes.
                if (child / MARKER).exists() or (child / "pyvenv.cfg").exists():
                    self.reads.stat(child)
                    continue
                stack.append(child)
        yield from sorted(found)
