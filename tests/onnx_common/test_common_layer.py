"""The shared ONNX layer other plugins build on: ``models.load_model`` (with or without
the external data beside a model), ``graph.GraphIndex`` (who produces and who reads each
tensor), and the import structure of qbuild_onnx, qbuild_onnx_common and qbuild_generic
(no modules importing each other in a cycle, counting imports inside functions)."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from qbuild_onnx_common.graph import GraphIndex
from qbuild_onnx_common.models import file_uses_external_data, load_model

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"
PACKAGES = ("qbuild_onnx", "qbuild_onnx_common", "qbuild_generic")


def _graph() -> onnx.GraphProto:
    """x -> Mul(x, w) -> Add(m, m) -> y, plus a Dropout whose mask output is left out."""
    w = numpy_helper.from_array(np.full((4,), 2.0, np.float32), "w")
    nodes = [helper.make_node("Mul", ["x", "w"], ["m"], name="mul"),
             helper.make_node("Add", ["m", "m"], ["y"], name="add"),
             helper.make_node("Dropout", ["y", "", ""], ["d", ""], name="drop")]
    return helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4]),
         helper.make_tensor_value_info("d", TensorProto.FLOAT, [4])], [w])


def test_graph_index_maps_producers_readers_initializers_and_outputs():
    index = GraphIndex(_graph())
    assert {t: n.name for t, n in index.producers.items()} == {"m": "mul", "y": "add",
                                                                 "d": "drop"}
    assert {t: [n.name for n in ns] for t, ns in index.consumers.items()} == {
        "x": ["mul"], "w": ["mul"], "m": ["add", "add"], "y": ["drop"]}
    assert list(index.initializers) == ["w"]
    assert index.outputs == {"y", "d"}
    assert "" not in index.producers and "" not in index.consumers  # left-out names


def test_use_count_counts_every_input_that_reads_a_tensor():
    index = GraphIndex(_graph())
    assert (index.use_count("m"), index.use_count("w"), index.use_count("d")) == (2, 1, 0)


def test_unique_name_avoids_the_names_the_graph_has_now():
    g = _graph()
    index = GraphIndex(g)
    assert index.unique_name("w") == "w_1"
    assert index.unique_name("new") == "new"
    g.initializer.append(numpy_helper.from_array(np.zeros(1, np.float32), "w_1"))
    assert index.unique_name("w") == "w_2"  # added after the index was built


def test_load_model_loads_external_data_unless_asked_not_to(tmp_path):
    model = helper.make_model(_graph(), opset_imports=[helper.make_opsetid("", 13)])
    onnx.save(model, str(tmp_path / "m.onnx"), save_as_external_data=True,
              location="m.data", size_threshold=0)
    assert file_uses_external_data(tmp_path / "m.onnx")
    full = load_model(tmp_path / "m.onnx")
    assert full == onnx.load(str(tmp_path / "m.onnx"))
    assert numpy_helper.to_array(full.graph.initializer[0]).tolist() == [2.0] * 4
    lean = load_model(str(tmp_path / "m.onnx"), external_data=False)
    assert lean.graph.initializer[0].data_location == TensorProto.EXTERNAL
    assert not lean.graph.initializer[0].raw_data


def _module_files() -> dict[str, Path]:
    files = {}
    for package in PACKAGES:
        for path in sorted((PLUGINS / package).rglob("*.py")):
            parts = list(path.relative_to(PLUGINS).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            files[".".join(parts)] = path
    return files


def _imports() -> dict[str, set[str]]:
    """Module -> the modules of these packages it imports, anywhere in its source."""
    files = _module_files()
    found: dict[str, set[str]] = {m: set() for m in files}
    for module, path in files.items():
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[:len(package.split(".")) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                names = [f"{source}.{a.name}" if f"{source}.{a.name}" in files else source
                         for a in node.names]
            else:
                continue
            found[module] |= {n for n in names if n in files and n != module}
    return found


def _cycle(imports: dict[str, set[str]]) -> list[str]:
    """One import cycle (its modules in order), or [] if there is none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str]:
        state[module] = 1
        path.append(module)
        for target in sorted(imports[module]):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        path.pop()
        state[module] = 2
        return []

    for module in sorted(imports):
        if module not in state:
            found = visit(module)
            if found:
                return found
    return []


def test_no_import_cycles_in_the_onnx_plugins():
    assert _cycle(_imports()) == []
