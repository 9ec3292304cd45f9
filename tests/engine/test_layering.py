"""Architecture rules, checked on the source: the engine never imports onnx, onnxruntime
or numpy; plugins use only qbuild's public API; the public API is what __all__ says."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENGINE_LAYERS = ("core", "api", "store", "analysis", "keys", "execution", "shortcuts", "build",
                 "commands")
"""The engine's sub-packages, lowest first: a module imports only from its own
sub-package and the ones before it (docs/architecture.md draws the layout)."""
FORBIDDEN_IN_ENGINE = {"onnx", "onnxruntime", "numpy"}


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_engine_never_imports_onnx_onnxruntime_or_numpy():
    for path in (ROOT / "qbuild").rglob("*.py"):
        roots = {name.split(".")[0] for name in _imports(path)}
        assert not roots & FORBIDDEN_IN_ENGINE, path


def test_plugins_use_only_the_public_api():
    for path in (ROOT / "plugins").rglob("*.py"):
        for name in _imports(path):
            if name.startswith("qbuild."):
                assert name in ("qbuild.testing", "qbuild.hookspecs"), f"{path}: {name}"


def test_plugin_top_levels_import_no_heavy_library():
    """Importing every built-in plugin registers rules without importing onnx or numpy."""
    code = ("import sys, qbuild.analysis.plugins as p; r = p.load_registry(); "
            "print(sorted(m for m in ('onnx', 'onnxruntime', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def test_public_api_is_sorted_and_complete():
    import qbuild

    assert qbuild.__all__ == sorted(qbuild.__all__)
    public = {n for n in dir(qbuild) if not n.startswith(("_", "@")) and n not in ("annotations",
              "pluggy", "hookspecs", "events", "cli", "testing", *ENGINE_LAYERS)}
    assert public - {"__version__"} <= set(qbuild.__all__)


def test_every_module_has_a_docstring():
    for folder in ("qbuild", "plugins"):
        for path in (ROOT / folder).rglob("*.py"):
            assert ast.get_docstring(ast.parse(path.read_text())), path


# The public top-level modules sit between the layers: ``events`` with the vocabulary,
# ``qbuild`` (``__init__``) and ``hookspecs`` with the rule API, the command line and the
# test helpers above everything.
_TOP_RANK = {"events": 0, "__init__": 1, "hookspecs": 1, "cli": 9, "testing": 9, "__main__": 9}


def _engine_modules() -> dict[str, Path]:
    modules = {}
    for path in (ROOT / "qbuild").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    return modules


def _engine_imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Every qbuild module ``name`` imports, at the top, under TYPE_CHECKING or inside a
    function alike."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            submodules = [f"{module}.{alias.name}" for alias in node.names]
            # ``from pkg import module`` depends on the module, not on the package
            candidates = [m for m in submodules if m in modules] or [module]
        elif isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        else:
            continue
        for candidate in candidates:
            if candidate in modules and candidate != name:
                found.add(candidate)
    return found


def _rank(name: str) -> int:
    parts = name.split(".")
    if len(parts) == 1:
        return _TOP_RANK["__init__"]
    if parts[1] in ENGINE_LAYERS:
        return ENGINE_LAYERS.index(parts[1])
    return _TOP_RANK[parts[1]]


def test_engine_top_level_is_small():
    entries = [p.name for p in (ROOT / "qbuild").iterdir() if p.name != "__pycache__"]
    assert len(entries) <= 16, sorted(entries)


def test_engine_layers_import_only_downwards():
    """A module imports its own sub-package and lower layers only (function-local and
    TYPE_CHECKING imports included), and nothing below ``qbuild/__init__`` imports it."""
    modules = _engine_modules()
    wrong = []
    for name, path in sorted(modules.items()):
        for imported in sorted(_engine_imports(name, path, modules)):
            same_package = name.split(".")[:2] == imported.split(".")[:2]
            if imported == "qbuild" and name != "qbuild" and _rank(name) < 9:
                wrong.append(f"{name} -> qbuild (import the defining module instead)")
            elif not same_package and _rank(imported) > _rank(name):
                wrong.append(f"{name} -> {imported}")
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _package_graph(folder: Path, top: str) -> dict[str, set[str]]:
    modules = {}
    for path in folder.rglob("*.py"):
        parts = path.relative_to(folder.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    # a package's __init__ re-exporting its modules is not a dependency of theirs on it
    return {name: {m for m in _engine_imports(name, path, modules)
                   if not (m != top and name.startswith(m + "."))}
            for name, path in modules.items()}


def test_no_import_cycles_in_the_engine():
    assert _cycles(_package_graph(ROOT / "qbuild", "qbuild")) == []


def test_no_import_cycles_in_the_plugins():
    found = []
    for folder in sorted((ROOT / "plugins").iterdir()):
        if (folder / "__init__.py").exists():
            found += _cycles(_package_graph(folder, folder.name))
    assert found == []


def test_a_cold_build_calls_no_module_back_and_nothing_up():
    """At run time too the engine calls downwards: in a traced cold build
    (``bench/trace_cold_build.py``: every call between two engine modules) no two
    modules call each other both ways (a callback into the module that called is a
    cycle in time: hand the callee what it needs, or move the function to the module
    that owns its concern) and no module calls a function of a higher layer."""
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "trace_cold_build.py")],
                         capture_output=True, text=True, check=True).stdout
    assert "exit 0:" in out, out
    assert " 0 module pairs calling each other both ways, 0 calls up the layering" in out, out
