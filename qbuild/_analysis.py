"""Analysis: from target specs to checked ``Target``s with resolved dependencies.

Attributes are checked against the rule's schema (defaults applied), labels resolved,
source files and globs expanded and checked to exist inside the package, and the
dependency graph checked for cycles. Nothing runs here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._errors import ConfigError
from ._label import Label, Pattern, is_label_text, parse_label, parse_pattern
from ._loader import MATRIX_KIND, PackageLoader, TargetSpec
from ._plugins import Registry, RuleEntry
from ._rule import Rule, check_attrs
from ._workspace import Workspace

_GLOB_CHARS = set("*?[")


@dataclass
class Target:
    """A checked target. ``attrs`` is canonical: labels as ``//pkg:name``, source files as
    workspace-relative paths, defaults applied; it is what the action key covers."""

    label: Label
    kind: str
    build_file: str
    entry: RuleEntry | None = None
    rule: Rule | None = None
    attrs: dict[str, Any] = field(default_factory=dict)
    deps: list[Label] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)

    @property
    def is_group(self) -> bool:
        return self.entry is None


class Graph:
    """The analysed targets reachable from the requested ones."""

    def __init__(self, workspace: Workspace, registry: Registry) -> None:
        self.workspace = workspace
        self.registry = registry
        self.loader = PackageLoader(workspace, self._macro)
        self.targets: dict[Label, Target] = {}
        self.deep_globs = False  # a '**' glob: the no-op fast path cannot vouch for it

    def _macro(self, kind: str):
        entry = self.registry.get(kind)
        return getattr(entry.cls, "expand_targets", None) if entry is not None else None

    # -- patterns -----------------------------------------------------------------------
    def expand(self, patterns: Iterable[str], current_package: str | None) -> list[Label]:
        """Labels matched by target patterns, in order, without duplicates."""
        labels: list[Label] = []
        for text in patterns:
            pattern = parse_pattern(text, current_package)
            labels.extend(self._match(pattern, text))
        return list(dict.fromkeys(labels))

    def _match(self, pattern: Pattern, text: str) -> list[Label]:
        if pattern.recursive:
            found = []
            for package in self.loader.packages_under(pattern.package):
                found.extend(self._package_targets(package))
            if not found:
                raise ConfigError(f"pattern '{text}' matches no targets")
            return found
        if pattern.name is None:
            return self._package_targets(pattern.package)
        label = Label(pattern.package, pattern.name)
        self._require(label, None, None, None)
        return [label]

    def watched_files(self) -> list[str]:
        """Every file and directory whose stat decides this graph (for the no-op path)."""
        root = self.workspace.root
        files = {str(root / "qbuild.toml")}
        files.update(str(p) for p in self.loader.loaded_build_files())
        files.update(str(d) for d in self.loader.walked_dirs)
        for target in self.targets.values():
            for rel in target.sources:
                files.add(str(root / rel))
                files.add(str((root / rel).parent))
        return sorted(files)

    def _package_targets(self, package: str) -> list[Label]:
        specs = self.loader.load(package)
        variants = {v for spec in specs.values() for v in spec.variants}
        return [spec.label for spec in specs.values() if spec.label not in variants]

    def _require(self, label: Label, file: str | None, target: str | None,
                 attr: str | None) -> TargetSpec:
        where: dict[str, str | None] = {"file": file, "target": target, "attr": attr}
        if not self.loader.has_package(label.package):
            raise ConfigError(f"no package '//{label.package}' "
                              f"({self.loader.shown_path(label.package)} does not exist)", **where)
        spec = self.loader.target(label)
        if spec is None:
            names = sorted(n for n in self.loader.load(label.package) if "@" not in n)
            hint = ", ".join(names[:12]) + (" ..." if len(names) > 12 else "")
            where["file"] = where["file"] or self.loader.shown_path(label.package)
            raise ConfigError(f"no target '{label.name}' in package '//{label.package}' "
                              f"(it has: {hint or 'no targets'})", **where)
        return spec

    # -- analysis -----------------------------------------------------------------------
    def analyze(self, roots: Iterable[Label]) -> list[Label]:
        """Analyse ``roots`` and everything they depend on; return a topological order."""
        order: list[Label] = []
        state: dict[Label, int] = {}  # 1 = on the stack, 2 = done
        for root in roots:
            self._visit(root, state, order, [])
        return order

    def _visit(self, label: Label, state: dict[Label, int], order: list[Label],
               stack: list[Label]) -> None:
        if state.get(label) == 2:
            return
        if state.get(label) == 1:
            cycle = stack[stack.index(label):] + [label]
            spec = self.loader.target(label)
            raise ConfigError("dependency cycle: " + " -> ".join(str(x) for x in cycle),
                              file=spec.build_file if spec else None)
        state[label] = 1
        stack.append(label)
        target = self.targets.get(label) or self._analyze_one(label)
        self.targets[label] = target
        for dep in target.deps:
            self._visit(dep, state, order, stack)
        stack.pop()
        state[label] = 2
        order.append(label)

    def _analyze_one(self, label: Label) -> Target:
        spec = self._require(label, None, None, None)
        if spec.kind == MATRIX_KIND:
            return Target(label, MATRIX_KIND, spec.build_file, deps=list(spec.variants))
        entry = self.registry.get(spec.kind)
        where = {"file": spec.build_file, "target": str(label)}
        if entry is None:
            known = ", ".join(self.registry.kinds())
            raise ConfigError(f"unknown rule '{spec.kind}' (known rules: {known}; "
                              "is the plugin providing it installed?)", attr="rule", **where)
        rule = entry.cls()
        raw = {k: v for k, v in spec.raw.items()
               if k in rule.attrs or k not in spec.matrix_keys}
        try:
            values = check_attrs(rule, raw)
        except ConfigError as exc:
            raise exc.located(**where) from None
        target = Target(label, spec.kind, spec.build_file, entry, rule)
        for name, schema in rule.attrs.items():
            value = values[name]
            try:
                values[name] = self._resolve(schema.type, value, label, target)
            except ConfigError as exc:
                raise exc.located(attr=name, **where) from None
        try:
            rule.validate(values)
            outputs = rule.declared_outputs(label.name, values)
        except ConfigError as exc:
            raise exc.located(**where) from None
        _check_outputs(outputs, where)
        target.attrs = values
        target.outputs = list(outputs)
        target.deps = list(dict.fromkeys(target.deps))
        target.sources = list(dict.fromkeys(target.sources))
        return target

    def _resolve(self, kind: str, value: Any, label: Label, target: Target) -> Any:
        if value is None:
            return None
        if kind == "label":
            return self._dep(value, label, target)
        if kind == "label_list":
            return [dep for v in value for dep in self._deps(v, label, target)]
        if kind == "file":
            if is_label_text(value):
                return self._dep(value, label, target)
            paths = self._sources(value, label)
            if len(paths) != 1:
                raise ConfigError(f"'{value}' matches {len(paths)} files; expected exactly one")
            target.sources.extend(paths)
            return paths[0]
        if kind == "files":
            out: list[str] = []
            for item in value:
                if is_label_text(item):
                    out.extend(self._deps(item, label, target))
                else:
                    paths = self._sources(item, label)
                    target.sources.extend(paths)
                    out.extend(paths)
            return out
        return value

    def _dep(self, text: str, label: Label, target: Target) -> str:
        dep = parse_label(text, label.package)
        spec = self._require(dep, None, None, None)
        if spec.kind == MATRIX_KIND:
            raise ConfigError(f"{dep} is a matrix of {len(spec.variants)} variants; name one "
                              f"(e.g. {spec.variants[0]}) or use a list attribute")
        target.deps.append(dep)
        return str(dep)

    def _deps(self, text: str, label: Label, target: Target) -> list[str]:
        """Like ``_dep``, but a matrix group stands for all its variants, in order."""
        dep = parse_label(text, label.package)
        spec = self._require(dep, None, None, None)
        if spec.kind == MATRIX_KIND:
            target.deps.extend(spec.variants)
            return [str(v) for v in spec.variants]
        target.deps.append(dep)
        return [str(dep)]

    def _sources(self, text: str, label: Label) -> list[str]:
        rel = Path(text)
        if rel.is_absolute():
            raise ConfigError(f"'{text}' is an absolute path; name files relative to the package")
        if ".." in rel.parts:
            raise ConfigError(f"'{text}' leaves the package; refer to other packages' files "
                              "through their targets (labels)")
        package_dir = self.workspace.root / label.package
        self.loader.walked_dirs.add(package_dir)
        if "**" in text:
            self.deep_globs = True
        if _GLOB_CHARS & set(text):
            matches = sorted(p for p in package_dir.glob(text) if p.is_file())
            if not matches:
                raise ConfigError(f"glob '{text}' matches no files in "
                                  f"{label.package or '.'}/")
        else:
            path = package_dir / rel
            if not path.is_file():
                what = "is a directory, not a file" if path.is_dir() else "does not exist"
                raise ConfigError(f"source file '{text}' {what} "
                                  f"({(Path(label.package) / rel).as_posix()})")
            matches = [path]
        root = self.workspace.root
        return [p.relative_to(root).as_posix() for p in matches]


def _check_outputs(outputs: list[str], where: dict[str, str]) -> None:
    seen = set()
    for name in outputs:
        path = Path(name.rstrip("/"))
        if not name or path.is_absolute() or ".." in path.parts or name in seen:
            raise ConfigError(f"bad or duplicate output name {name!r}", **where)
        seen.add(name)
