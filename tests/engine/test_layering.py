"""Architecture rules, checked on the source: the engine never imports onnx, onnxruntime
or numpy; plugins use only qbuild's public API; the public API is what __all__ says."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
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
    code = ("import sys, qbuild._plugins as p; r = p.load_registry(); "
            "print(sorted(m for m in ('onnx', 'onnxruntime', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def test_public_api_is_sorted_and_complete():
    import qbuild

    assert qbuild.__all__ == sorted(qbuild.__all__)
    public = {n for n in dir(qbuild) if not n.startswith(("_", "@")) and n not in ("annotations",
              "pluggy", "hookspecs", "events", "cli", "testing")}
    assert public - {"__version__"} <= set(qbuild.__all__)


def test_every_module_has_a_docstring():
    for folder in ("qbuild", "plugins"):
        for path in (ROOT / folder).rglob("*.py"):
            assert ast.get_docstring(ast.parse(path.read_text())), path
