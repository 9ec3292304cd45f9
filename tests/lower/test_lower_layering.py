"""qbuild_lower's import structure, read from the source: each sub-package imports only
from the ones before it in ``ORDER`` (the layout its ``__init__`` describes), no modules
import each other in a cycle (counting imports inside functions), and no module imports
another module's private names."""

from __future__ import annotations

import ast
from pathlib import Path

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"
ROOT = "qbuild_lower"
ORDER = ["qdq", "arithmetic", "emit", "patterns", "lowering", "checking", "profiling", "rules"]


def _module_files() -> dict[str, Path]:
    files = {}
    for path in sorted((PLUGINS / ROOT).rglob("*.py")):
        parts = list(path.relative_to(PLUGINS).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        files[".".join(parts)] = path
    return files


def _edges() -> list[tuple[str, str, str]]:
    """(importing module, imported module, name taken from it or "") for every import of a
    qbuild_lower module, at module level or inside a function."""
    files = _module_files()
    edges = []
    for module, path in files.items():
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                edges += [(module, a.name, "") for a in node.names if a.name in files]
                continue
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] != ROOT:
                continue
            for alias in node.names:
                if f"{source}.{alias.name}" in files:
                    edges.append((module, f"{source}.{alias.name}", ""))
                else:
                    edges.append((module, source, alias.name))
    return [e for e in edges if e[0] != e[1]]


def _layer(module: str) -> int:
    parts = module.split(".")
    return ORDER.index(parts[1]) if len(parts) > 1 else -1


def test_every_sub_package_is_in_the_order():
    assert {m.split(".")[1] for m in _module_files() if "." in m} == set(ORDER)


def test_sub_packages_import_only_earlier_ones():
    upward = [f"{a} -> {b}" for a, b, _ in _edges() if _layer(b) > _layer(a)]
    assert upward == []


def test_no_private_names_imported_from_another_module():
    assert [f"{a}: {b}.{name}" for a, b, name in _edges() if name.startswith("_")] == []


def test_no_import_cycles():
    graph: dict[str, set[str]] = {}
    for a, b, _ in _edges():
        graph.setdefault(a, set()).add(b)
    done: set[str] = set()

    def cycle_from(module: str, path: list[str]) -> list[str] | None:
        for target in sorted(graph.get(module, ())):
            if target in path:
                return path[path.index(target):] + [target]
            if target not in done:
                found = cycle_from(target, path + [target])
                if found:
                    return found
        done.add(module)
        return None

    cycles = [cycle_from(m, [m]) for m in sorted(graph)]
    assert [" -> ".join(c) for c in cycles if c] == []
