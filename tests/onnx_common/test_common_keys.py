"""The shared ONNX layer (qbuild_onnx_common) is part of the action key of every rule that
uses it: every rule of the three ONNX plugins derives from ``OnnxRule``, so qbuild keys the
layer's source with the rule's own, and editing a function there reruns dependent actions."""

from __future__ import annotations

import shutil
from importlib.metadata import entry_points
from pathlib import Path

import onnx
import qbuild_onnx_common
from onnx import TensorProto, helper
from qbuild_onnx_common.rule import OnnxRule

ONNX_PLUGINS = {"onnx_source", "onnx_quantize", "onnx_accuracy", "lower", "dtypes"}


def _tiny_model() -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "tiny",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_every_rule_of_the_onnx_plugins_is_an_onnx_rule():
    rules = []
    for ep in entry_points(group="qbuild"):
        if ep.name in ONNX_PLUGINS:
            rules.extend(ep.load().qbuild_rule_types())
    kinds = {cls.kind for cls in rules}
    assert {"onnx_model", "calibrate", "quantize", "evaluate", "auto_quantize",
            "lower_integer", "qdq_retarget"} <= kinds
    outside = sorted(cls.kind for cls in rules if not issubclass(cls, OnnxRule))
    assert outside == [], f"rules whose key would miss qbuild_onnx_common: {outside}"
    for cls in rules:  # an override of code() keeps the shared layer in the key
        attrs = {name: a.default for name, a in cls.attrs.items()}
        attrs.update(reader="readers:read")
        assert "qbuild_onnx_common" in cls().code(attrs), cls.kind


def test_editing_a_function_in_the_shared_layer_reruns_a_dependent_action(
        qbuild_workspace, tmp_path, monkeypatch):
    ws = qbuild_workspace
    ws.path("m").mkdir(parents=True)
    onnx.save(_tiny_model(), str(ws.path("m/tiny.onnx")))
    ws.write("m/BUILD.toml", '[tiny]\nrule = "onnx_model"\nsrc = "tiny.onnx"\n')
    first = ws.build("//m:tiny")
    assert first.ok, first.error
    assert ws.build("//m:tiny").ran == []

    # The same package with one function edited, where qbuild looks for its source.
    edited = tmp_path / "edited" / "qbuild_onnx_common"
    shutil.copytree(Path(qbuild_onnx_common.__file__).parent, edited,
                    ignore=shutil.ignore_patterns("__pycache__"))
    files = edited / "files.py"
    text = files.read_text()
    body = "    return hashlib.sha256(data).hexdigest()\n"
    assert body in text
    files.write_text(text.replace(body, "    data = bytes(data)\n" + body))
    monkeypatch.setattr(qbuild_onnx_common, "__path__", [str(edited)])

    again = ws.build("//m:tiny", explain=True)
    assert again.ok, again.error
    assert again.ran == ["//m:tiny"]
    assert "rule code changed: qbuild_onnx_common/files.py" in again.explanations["//m:tiny"]
