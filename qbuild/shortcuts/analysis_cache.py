"""The analysis cache: the analysed targets of the last full build of a request, reused
while nothing the analysis read has changed.

Analysis (parsing BUILD files, expanding matrices, macros and globs, checking attributes,
resolving labels) is a function of what it reads, and ``Reads`` records exactly that:
``qbuild.toml`` and every BUILD file as stat'ed before parsing, every directory a glob or
package walk listed (including those skipped for holding a nested workspace). The cache
entry stores those stats next to the analysed targets, with the code that analysed them
(the stat of every loaded Python module, the plugins' rules and distributions, the
interpreter and ``sys.path`` fingerprint of ``_noop.environment``). It is used only if
every one of them is unchanged, so an edited source file reuses the analysis (its
content is digested when keys are computed, as always), while a BUILD edit, a new or
removed file in a globbed folder, a nested ``qbuild.toml``, an edited rule module or an
upgraded plugin analyses again.

What analysis checks about each source file beyond its folder's listing is checked
again on every use: it is still a regular file (not a symlink, unless it was one, in
which case it must still resolve inside the workspace), and every folder from the root
down to it is still the same folder (inode), so a folder swapped for a link out of the
workspace is noticed. Stats taken too close to the build's start to vouch for the bytes
read (``key_is_racy``) are never recorded, as for the no-op fast path.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

from ..analysis.graph import Graph, Target
from ..analysis.loader import MATRIX_KIND
from ..analysis.reads import folder_identities, same_folders
from ..api.actions import ActionSpec
from ..core.files import key_is_racy
from ..core.labels import Label

_VERSION = 3


def _stat(path: str) -> str | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def _label(text: str, labels: dict[str, Label] | None = None) -> Label:
    """``text`` as a Label; ``labels`` memoises them (a label is named once as a target
    and again by each dependent: one object for all)."""
    if labels is not None:
        found = labels.get(text)
        if found is not None:
            return found
    package, name = text[2:].split(":", 1)
    label = Label(package, name)
    if labels is not None:
        labels[text] = label
    return label


def _path(output_dir: Path, patterns: list[str], package: str | None) -> Path:
    request = json.dumps([patterns, package])
    name = hashlib.sha256(request.encode()).hexdigest()[:24]
    return output_dir / ".qbuild" / "analysis" / f"{name}.json"


def _code(graph: Graph) -> dict[str, Any]:
    """The plugins as registered, and the environment that imported them."""
    from .noop import environment

    entries = sorted([kind, e.ref, e.dist, e.dist_version, e.cls.version]
                     for kind, e in graph.registry.entries.items())
    return {"rules": entries, "environment": environment()}


def _modules() -> dict[str, str | None]:
    files = {}
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if file:
            files[file] = _stat(file)
    return files


_STORED = {"label", "kind", "build_file", "entry", "rule", "attrs", "deps", "sources",
           "outputs", "tags", "inactive", "actions"}


def _unstored_defaults() -> list[tuple[str, Any]]:
    """(name, default) of every ``Target`` field not stored here."""
    out = []
    for item in dataclasses.fields(Target):
        if item.name not in _STORED:
            out.append((item.name, item.default_factory() if item.default_factory is not
                        dataclasses.MISSING else item.default))
    return out


def _storable(target: Target, unstored: list[tuple[str, Any]]) -> bool:
    """Every field of ``target`` that is not stored here holds its default (a field
    added to ``Target`` later is never silently dropped: such targets are not cached)."""
    return all(getattr(target, name) == default for name, default in unstored)


_PLAIN = frozenset({str, int, float, bool, type(None)})


def _plain(value: Any) -> bool:
    """Only dicts with string keys, lists, strings, numbers, booleans and None, of
    exactly those types, all the way down: what JSON gives back exactly as it was (1.0
    stays a float, NaN stays NaN), where a tuple would come back a list and a str
    subclass a str. (A walk of the value alone, not a comparison with it decoded.)"""
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is dict:
            for key in item:
                if type(key) is not str:
                    return False
            stack.extend(item.values())
        elif kind is list:
            stack.extend(item)
        elif kind not in _PLAIN:
            return False
    return True


def save(graph: Graph, patterns: list[str], package: str | None, labels: list[Label],
         started: float) -> None:
    """Record the analysis just done (best effort; nothing is recorded if a stat it
    rests on is too recent to vouch for what was read)."""
    workspace = graph.workspace
    reads = graph.loader.reads
    if reads.conflicting:
        return
    stats = dict(reads.stats)
    stats["qbuild.toml"] = workspace.marker_stat
    modules = _modules()
    for key in (*stats.values(), *modules.values()):
        if key is not None and key_is_racy(key, started):
            return
    root = workspace.root
    targets = []
    sources: set[str] = set()
    links: list[str] = []
    unstored = _unstored_defaults()
    for target in graph.targets.values():
        if not _storable(target, unstored):
            return
        targets.append([str(target.label), target.kind, target.build_file, target.attrs,
                        [str(d) for d in target.deps], target.sources, target.outputs,
                        list(target.tags), list(target.inactive),
                        [spec.describe() for spec in target.actions]])
        for rel in target.sources:
            if rel not in sources:
                sources.add(rel)
                try:
                    if stat.S_ISLNK(os.lstat(root / rel).st_mode):
                        links.append(rel)
                except OSError:
                    return
    dirs = folder_identities(root, sources)
    if dirs is None:
        return
    record = {"version": _VERSION, "code": _code(graph), "modules": modules,
              "reads": stats, "dirs": dirs, "links": sorted(links),
              "labels": [str(label) for label in labels], "targets": targets}
    if not _plain(targets):
        return  # a value JSON cannot hold as is: analyse every time
    try:
        text = json.dumps(record, allow_nan=True)
        path = _path(workspace.output_dir, patterns, package)
        path.parent.mkdir(parents=True, exist_ok=True)
        temp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        temp.write_text(text, encoding="utf-8")
        os.replace(temp, path)
    except (OSError, TypeError, ValueError, RecursionError):
        return
    graph.analysis_digest = hashlib.sha256(text.encode()).hexdigest()


def _spec(described: dict[str, Any]) -> ActionSpec:
    """An ``ActionSpec`` from its ``describe()``, its fields set as the generated
    __init__ would (a frozen class sets each through object.__setattr__; a restore
    makes one per target)."""
    spec: ActionSpec = _new(ActionSpec)
    spec.__dict__.update(
        mnemonic=described["mnemonic"], function=described["function"],
        inputs=tuple(described["inputs"]), outputs=tuple(described["outputs"]),
        params=described["params"], heavy=described["heavy"],
        layout=described.get("layout", {}),
        link_inputs=bool(described.get("link_inputs", False)))
    return spec


_new = object.__new__


def restore(graph: Graph, patterns: list[str], package: str | None) -> list[Label] | None:
    """The labels the patterns expand to, with ``graph.targets`` filled in as the last
    analysis left them, if nothing that analysis read has changed; else None (and the
    graph is untouched)."""
    workspace = graph.workspace
    root = workspace.root
    try:
        text = _path(workspace.output_dir, patterns, package).read_text(encoding="utf-8")
        record = json.loads(text)
        if record.get("version") != _VERSION or record["code"] != _code(graph):
            return None
        stats = record["reads"]
        if stats.pop("qbuild.toml", None) != workspace.marker_stat:
            return None
        for name, key in (*stats.items(), *record["modules"].items()):
            if _stat(name if os.path.isabs(name) else os.path.join(root, name)) != key:
                return None
        if not same_folders(root, record["dirs"]):
            return None
        links = set(record["links"])
        targets: dict[Label, Target] = {}
        checked: set[str] = set()
        kinds: dict[str, Any] = {}
        known: dict[str, Label] = {}
        for label_text, kind, build_file, attrs, deps, sources, outputs, tags, inactive, \
                actions in record["targets"]:
            label = _label(label_text, known)
            dep_labels = [_label(d, known) for d in deps]
            if kind == MATRIX_KIND:
                targets[label] = Target(label, kind, build_file, deps=dep_labels,
                                        tags=tuple(tags))
                continue
            if kind not in kinds:
                entry = graph.registry.get(kind)
                if entry is None or entry.cls.missing_requirements():
                    return None
                kinds[kind] = entry
            entry = kinds[kind]
            for rel in sources:
                if rel in checked:
                    continue
                checked.add(rel)
                st = os.lstat(os.path.join(root, rel))
                if rel in links:
                    graph._check_inside(root / rel, rel)
                elif not stat.S_ISREG(st.st_mode):
                    return None
            targets[label] = Target(label, kind, build_file, entry, entry.cls(), attrs,
                                    dep_labels, sources, outputs, tuple(tags),
                                    tuple(inactive), [_spec(a) for a in actions])
        labels = [_label(text, known) for text in record["labels"]]
    except Exception:  # noqa: BLE001 - absent, damaged or stale: analyse as usual
        return None
    graph.targets.update(targets)
    graph.loader.reads.stats.update(stats)
    graph.analysis_digest = hashlib.sha256(text.encode()).hexdigest()
    return labels
