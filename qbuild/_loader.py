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

import itertools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._errors import ConfigError
from ._label import Label, _check_name
from ._toml import load_toml
from ._workspace import BUILD_FILE, MARKER, Workspace

MATRIX_KIND = "matrix"
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


def _expand(package: str, name: str, table: dict[str, Any], shown: str) -> list[TargetSpec]:
    kind = table.get("rule")
    label = Label(package, name)
    if kind is None:
        raise ConfigError("missing 'rule' (the rule kind, e.g. rule = \"command\")",
                          file=shown, target=str(label))
    if not isinstance(kind, str):
        raise ConfigError("'rule' must be a string", file=shown, target=str(label), attr="rule")
    raw = {k: v for k, v in table.items() if k not in ("rule", "matrix")}
    matrix = table.get("matrix")
    if matrix is None:
        return [TargetSpec(label, kind, raw, shown)]
    where = {"file": shown, "target": str(label), "attr": "matrix"}
    if not isinstance(matrix, dict) or not matrix:
        raise ConfigError("'matrix' must be a non-empty table of lists", **where)
    axes = []
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
    specs = []
    group = TargetSpec(label, MATRIX_KIND, {}, shown)
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
        attrs.update({key: v for (key, _), v in zip(axes, combination)})
        variant = Label(package, variant_name)
        specs.append(TargetSpec(variant, kind, attrs, shown,
                                matrix_keys=tuple(key for key, _ in axes)))
        group.variants.append(variant)
    return [group, *specs]


MacroLookup = Callable[[str], Callable[[str, dict[str, Any]], Any] | None]


def _expand_macro(package: str, spec: TargetSpec, expander, shown: str,
                  targets: dict[str, TargetSpec]) -> list[TargetSpec]:
    where = {"file": shown, "target": str(spec.label)}
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
        self.walked_dirs: set[Path] = set()  # directories whose listing mattered

    def build_file(self, package: str) -> Path:
        return self.workspace.root / package / BUILD_FILE

    def shown_path(self, package: str) -> str:
        return f"{package}/{BUILD_FILE}" if package else BUILD_FILE

    def loaded_build_files(self) -> list[Path]:
        return [self.build_file(package) for package in self._packages]

    def has_package(self, package: str) -> bool:
        return package in self._packages or self.build_file(package).is_file()

    def load(self, package: str) -> dict[str, TargetSpec]:
        """The targets of ``package``, by name. Raises ConfigError if it has no BUILD.toml."""
        cached = self._packages.get(package)
        if cached is not None:
            return cached
        path = self.build_file(package)
        shown = self.shown_path(package)
        if not path.is_file():
            raise ConfigError(f"no package '//{package}': {shown} does not exist")
        data = load_toml(path, shown)
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

    def target(self, label: Label) -> TargetSpec | None:
        return self.load(label.package).get(label.name)

    def packages_under(self, package: str) -> Iterator[str]:
        """Every package at or below ``package``, in sorted order (skips hidden dirs,
        the output dir and nested workspaces)."""
        root = self.workspace.root
        start = root / package
        if not start.is_dir():
            raise ConfigError(f"no directory '{package}' in the workspace for '//{package}/...'")
        output_dir = self.workspace.output_dir
        found = []
        for directory, subdirs, files in os.walk(start):
            here = Path(directory)
            self.walked_dirs.add(here)
            subdirs[:] = sorted(
                d for d in subdirs
                if not d.startswith(".") and d not in _SKIP_DIRS
                and here / d != output_dir and not (here / d / MARKER).exists()
                and not (here / d / "pyvenv.cfg").exists()
            )
            if BUILD_FILE in files:
                rel = here.relative_to(root).as_posix()
                found.append("" if rel == "." else rel)
        yield from sorted(found)
