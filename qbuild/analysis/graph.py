"""Analysis: from target specs to checked ``Target``s with resolved dependencies.

Attributes are checked against the rule's schema (defaults applied), labels resolved,
source files and globs expanded and checked to exist inside the package, and the
dependency graph checked for cycles, dependencies checked to give the providers their
attribute asks for, and a v2 rule's ``analyze`` called to declare its actions. Nothing
runs here.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..api.actions import ActionSpec, AnalysisContext
from ..api.attrs import Attr
from ..api.providers import provider_name
from ..api.rule import Rule, check_attrs, inactive_attrs
from ..core.errors import ConfigError
from ..core.labels import OUT_PREFIX, Label, Pattern, is_label_text, parse_label, parse_pattern
from .glob import glob_files, has_magic
from .loader import MATRIX_KIND, PackageLoader, TargetSpec
from .plugins import Registry, RuleEntry
from .workspace import Workspace


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
    tags: tuple[str, ...] = ()
    inactive: tuple[str, ...] = ()  # attributes that do not apply (kept at their default)
    actions: list[ActionSpec] = field(default_factory=list)  # v2 rules only

    @property
    def is_group(self) -> bool:
        return self.entry is None


class Graph:
    """The analysed targets reachable from the requested ones."""

    def __init__(self, workspace: Workspace, registry: Registry) -> None:
        self.workspace = workspace
        self.registry = registry
        self.loader = PackageLoader(workspace, registry.expander)
        self.targets: dict[Label, Target] = {}
        # sha-256 of the analysis cache entry these targets came from or went into
        # (``_analysis_cache``); None when they are not cached
        self.analysis_digest: str | None = None
        self._tops = (str(workspace.output_dir), str(workspace.cache_dir),
                      str(workspace.root / OUT_PREFIX))
        self._real_tops = (os.path.realpath(workspace.root),
                           os.path.realpath(workspace.output_dir))
        self._real_dirs: dict[str, str] = {}

    # -- patterns -----------------------------------------------------------------------
    def expand(self, patterns: Iterable[str], current_package: str | None, *,
               query: bool = False) -> list[Label]:
        """Labels matched by target patterns, in order, without duplicates.

        Building (the default), ``//...`` and ``:all`` leave out targets tagged
        ``manual`` and name matrix groups; a query (``query=True``) sees every target,
        each matrix variant after its group, as Bazel's query does.
        """
        labels: list[Label] = []
        for text in patterns:
            pattern = parse_pattern(text, current_package)
            labels.extend(self._match(pattern, text, query))
        return list(dict.fromkeys(labels))

    def _match(self, pattern: Pattern, text: str, query: bool) -> list[Label]:
        if pattern.recursive:
            found = []
            for package in self.loader.packages_under(pattern.package):
                found.extend(self._package_targets(package, query))
            if not found and not query:
                raise ConfigError(f"pattern '{text}' matches no targets (targets tagged "
                                  "\"manual\" are built only by name)")
            return found
        if pattern.name is None:
            return self._package_targets(pattern.package, query)
        label = Label(pattern.package, pattern.name)
        self._require(label, None, None, None)
        return [label]

    def _package_targets(self, package: str, query: bool = False) -> list[Label]:
        specs = self.loader.load(package)
        if query:
            return [spec.label for spec in specs.values()]
        variants = {v for spec in specs.values() for v in spec.variants}
        return [spec.label for spec in specs.values()
                if spec.label not in variants and not spec.manual]

    def _require(self, label: Label, file: str | None, target: str | None,
                 attr: str | None) -> TargetSpec:
        where: dict[str, Any] = {"file": file, "target": target, "attr": attr}
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
        """Analyse ``roots`` and everything they depend on; return a topological order.

        Depth-first with an explicit stack, so chains of any length work."""
        order: list[Label] = []
        state: dict[Label, int] = {}  # 1 = on the stack, 2 = done
        for root in roots:
            if state.get(root) == 2:
                continue
            stack: list[tuple[Label, int]] = []  # (label, index of the next dep to visit)
            self._enter(root, state, stack)
            while stack:
                label, index = stack[-1]
                deps = self.targets[label].deps
                if index == len(deps):
                    stack.pop()
                    state[label] = 2
                    order.append(label)
                    continue
                stack[-1] = (label, index + 1)
                dep = deps[index]
                if state.get(dep) == 2:
                    continue
                if state.get(dep) == 1:
                    path = [item for item, _ in stack]
                    cycle = path[path.index(dep):] + [dep]
                    spec = self.loader.target(dep)
                    raise ConfigError("dependency cycle: " + " -> ".join(str(x) for x in cycle),
                                      file=spec.build_file if spec else None)
                self._enter(dep, state, stack)
        return order

    def _enter(self, label: Label, state: dict[Label, int],
               stack: list[tuple[Label, int]]) -> None:
        state[label] = 1
        if label not in self.targets:
            self.targets[label] = self._analyze_one(label)
        stack.append((label, 0))

    def _analyze_one(self, label: Label) -> Target:
        spec = self._require(label, None, None, None)
        if spec.kind == MATRIX_KIND:
            return Target(label, MATRIX_KIND, spec.build_file, deps=list(spec.variants),
                          tags=spec.tags)
        entry = self.registry.get(spec.kind)
        where: dict[str, Any] = {"file": spec.build_file, "target": str(label)}
        if entry is None:
            known = ", ".join(self.registry.kinds())
            raise ConfigError(f"unknown rule '{spec.kind}' (known rules: {known}; "
                              "is the plugin providing it installed?)", attr="rule", **where)
        missing = entry.cls.missing_requirements()
        if missing:
            hint = entry.cls.install_hint or f"pip install {' '.join(missing)}"
            raise ConfigError(f"rule '{spec.kind}' needs {', '.join(missing)}, which "
                              f"{'is' if len(missing) == 1 else 'are'} not installed: "
                              f"{hint}", attr="rule", **where)
        rule = entry.cls()
        raw = {k: v for k, v in spec.raw.items()
               if k in rule.attrs or k not in spec.matrix_keys}
        try:
            values = check_attrs(rule, raw)
        except ConfigError as exc:
            raise exc.located(**where) from None
        target = Target(label, spec.kind, spec.build_file, entry, rule, tags=spec.tags)
        # An attribute that does not apply (e.g. calibrate's percentile when the method is
        # minmax) keeps its default, so setting it does not change the variant's key.
        inactive = inactive_attrs(rule, values)
        for name in inactive:
            values[name] = rule.attrs[name].default_value()
        target.inactive = tuple(inactive)
        for name, schema in rule.attrs.items():
            value = values[name]
            try:
                values[name] = self._resolve(schema, value, label, target)
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
        ctx = AnalysisContext(label=str(label), attrs=values,
                              attr_types={n: s.type for n, s in rule.attrs.items()},
                              outputs=target.outputs, heavy=bool(rule.heavy),
                              build_file=target.build_file)
        try:
            rule.analyze(ctx)
            target.actions = ctx.finish()
        except ConfigError as exc:
            raise exc.located(**where) from None
        target.deps = list(dict.fromkeys(target.deps))
        target.sources = list(dict.fromkeys(target.sources))
        return target

    def _resolve(self, schema: Attr, value: Any, label: Label, target: Target) -> Any:
        kind = schema.type
        if value is None:
            return None
        if kind == "label":
            return self._dep(value, label, target, schema.providers)
        if kind == "label_list":
            return [dep for v in value
                    for dep in self._deps(v, label, target, schema.providers)]
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
                    paths = self._sources(item, label, schema.folder_suffixes)
                    target.sources.extend(paths)
                    out.extend(paths)
            return out
        return value

    def _dep(self, text: str, label: Label, target: Target,
             providers: tuple[type, ...] = ()) -> str:
        dep = parse_label(text, label.package)
        spec = self._require(dep, None, None, None)
        if spec.kind == MATRIX_KIND:
            raise ConfigError(f"{dep} is a matrix of {len(spec.variants)} variants; name one "
                              f"(e.g. {spec.variants[0]}) or use a list attribute")
        self._check_providers(dep, spec, providers)
        target.deps.append(dep)
        return str(dep)

    def _deps(self, text: str, label: Label, target: Target,
              providers: tuple[type, ...] = ()) -> list[str]:
        """Like ``_dep``, but a matrix group stands for all its variants, in order."""
        dep = parse_label(text, label.package)
        spec = self._require(dep, None, None, None)
        if spec.kind == MATRIX_KIND:
            for variant in spec.variants:
                self._check_providers(variant, self._require(variant, None, None, None),
                                      providers)
            target.deps.extend(spec.variants)
            return [str(v) for v in spec.variants]
        self._check_providers(dep, spec, providers)
        target.deps.append(dep)
        return [str(dep)]

    def _check_providers(self, dep: Label, spec: TargetSpec,
                         providers: tuple[type, ...]) -> None:
        """Refuse a dependency whose rule does not declare every provider asked for
        (from its rule class alone: the dependency need not be analysed yet)."""
        if not providers:
            return
        entry = self.registry.get(spec.kind)
        if entry is None:
            return  # its own analysis reports the unknown rule
        if not entry.cls.is_v2() and not entry.cls.provides:
            # A v1 rule that declares no providers predates them: it is not checked
            # (its dependents fall back to its files) until it declares what it gives.
            return
        given = entry.cls.provider_names()
        for provider in providers:
            if provider_name(provider) not in given:
                has = ", ".join(sorted(n.rsplit(".", 1)[-1] for n in given))
                raise ConfigError(f"{dep} (rule '{spec.kind}') does not provide "
                                  f"{provider.__qualname__} (it provides: {has})")

    def _sources(self, text: str, label: Label,
                 folder_suffixes: tuple[str, ...] | None = None) -> list[str]:
        if "\0" in text:
            raise ConfigError(f"{text!r} contains a NUL character")
        rel = Path(text)
        if rel.is_absolute():
            raise ConfigError(f"'{text}' is an absolute path; name files relative to the package")
        if ".." in rel.parts:
            raise ConfigError(f"'{text}' leaves the package; refer to other packages' files "
                              "through their targets (labels)")
        # Checked before any stat: the system call would fail with ENAMETOOLONG.
        if any(len(part.encode("utf-8", "surrogateescape")) > 255 for part in rel.parts):
            raise ConfigError(f"source name '{text[:40]}...' has a part over 255 bytes "
                              "(the longest file name a filesystem allows)")
        package_dir = self.workspace.root / label.package
        if has_magic(text):
            skip = {self.workspace.output_dir, self.workspace.cache_dir,
                    self.workspace.root / OUT_PREFIX}
            matches = [p for p in glob_files(package_dir, text, self.loader.reads, skip)
                       if not self._reserved(p)]
            if not matches:
                raise ConfigError(f"glob '{text}' matches no files in "
                                  f"{label.package or '.'}/")
        elif folder_suffixes is not None and (package_dir / rel).is_dir():
            matches = self._folder(package_dir / rel, text, label, folder_suffixes)
        else:
            path = package_dir / rel
            if self._reserved(path):
                raise ConfigError(f"source file '{text}' lies in qbuild's output or cache "
                                  "folder; depend on the target that makes it (a label)")
            if not path.is_file():
                what = "is a directory, not a file" if path.is_dir() else "does not exist"
                raise ConfigError(f"source file '{text}' {what} "
                                  f"({(Path(label.package) / rel).as_posix()})")
            matches = [path]
        root = self.workspace.root
        for path in matches:
            self._check_inside(path, text)
        return [p.relative_to(root).as_posix() for p in matches]

    def _reserved(self, path: Path) -> bool:
        """Inside the output folder, the cache, or what an action's sandbox keeps for
        outputs (``qbuild-out/``): never a source, whatever a glob says."""
        text = str(path)
        return any(text == top or text.startswith(top + os.sep) for top in self._tops)

    def _realpath(self, path: Path) -> str:
        """``os.path.realpath(path)``, with the real path of each folder worked out once
        per command (a package's sources share it)."""
        parent, name = os.path.split(str(path))
        real_parent = self._real_dirs.get(parent)
        if real_parent is None:
            real_parent = self._real_dirs[parent] = os.path.realpath(parent)
        candidate = os.path.join(real_parent, name)
        return os.path.realpath(candidate) if os.path.islink(candidate) else candidate

    def _check_inside(self, path: Path, text: str) -> None:
        """A source reached through a symlink must still be a file of this workspace."""
        real = self._realpath(path)
        ws = self.workspace
        root, output_dir = self._real_tops
        if not _under(real, root):
            raise ConfigError(f"source file '{text}' ({path.relative_to(ws.root).as_posix()}) "
                              f"is a symlink to {real}, outside the workspace; copy the file "
                              "into the workspace")
        if _under(real, output_dir) or _under(real, str(ws.cache_dir)):
            raise ConfigError(f"source file '{text}' is a symlink into qbuild's output or "
                              "cache folder; depend on the target that makes it (a label)")

    def _folder(self, folder: Path, text: str, label: Label,
                suffixes: tuple[str, ...]) -> list[Path]:
        """The files directly in ``folder`` with one of ``suffixes`` (any if empty),
        sorted; hidden files are left out. The folder's listing is noted (fast path)."""
        matches = sorted(folder / e.name for e in self.loader.reads.listdir(folder)
                         if not e.name.startswith(".") and (folder / e.name).is_file()
                         and not self._reserved(folder / e.name)
                         and (not suffixes or Path(e.name).suffix.lower() in suffixes))
        if not matches:
            kinds = "/".join(suffixes) if suffixes else "any"
            raise ConfigError(f"folder '{text}' holds no files ({kinds}) in "
                              f"{label.package or '.'}/")
        return matches


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip(os.sep) + os.sep)


def _check_outputs(outputs: list[str], where: dict[str, Any]) -> None:
    seen = set()
    for name in outputs:
        if not isinstance(name, str):
            raise ConfigError(f"output names must be strings, got {name!r}", **where)
        segments = name.rstrip("/").split("/")
        if (not name or name.startswith("/") or name in seen or "\0" in name
                or any(s in ("", ".", "..") for s in segments)):
            raise ConfigError(f"bad or duplicate output name {name[:80]!r} (a relative path "
                              "of named files, no '.', '..' or NUL)", **where)
        if any(len(s.encode("utf-8")) > 255 for s in segments):
            raise ConfigError(f"output name {name[:40]!r}... has a part over 255 bytes",
                              **where)
        seen.add(name)
