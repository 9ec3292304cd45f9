"""The dtype plugin's import structure, checked on the source: its packages are layered
(each imports only from the ones before it), no module imports another in a cycle (at
module level or inside a function), and none imports another module's private names."""

from __future__ import annotations

import ast
from pathlib import Path

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"
PACKAGE = "qbuild_dtypes"
# Lower layers first; rules and hookspecs are the top (rules registers hookspecs).
LAYERS = ["numerics", "graph", "validation", "runtime", "conversion", "hookspecs", "rules"]


def _modules() -> dict[str, Path]:
    found = {}
    for path in (PLUGINS / PACKAGE).rglob("*.py"):
        parts = list(path.relative_to(PLUGINS).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(module: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, str]]:
    """(imported module, imported name or "") for every import of a qbuild_dtypes module,
    wherever it is in the file."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            if target.split(".")[0] != PACKAGE:
                continue
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                if submodule in modules:
                    found.append((submodule, ""))
                else:
                    found.append((target, alias.name))
        elif isinstance(node, ast.Import):
            found += [(a.name, "") for a in node.names if a.name.split(".")[0] == PACKAGE]
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {m: {t for t, _ in _imports(m, p, modules) if t != m}
            for m, p in modules.items()}


def _layer(module: str) -> int:
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 else -1


def test_no_module_imports_private_names():
    modules = _modules()
    private = [f"{m}: {t}.{name}" for m, p in modules.items()
               for t, name in _imports(m, p, modules) if name.startswith("_")]
    assert private == []


def test_packages_are_layered():
    upward = [f"{m} -> {t}" for m, targets in _graph().items() for t in targets
              if _layer(t) > _layer(m)]
    assert upward == []


def test_no_import_cycles():
    graph = _graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                cycles.append(" -> ".join(path[path.index(target):] + [target]))
            elif target not in state:
                visit(target, path + [target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert cycles == []
