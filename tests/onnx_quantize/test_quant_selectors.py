"""Stable selectors for nodes and tensors, and errors that explain names an optimizer removed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.helper as H
import onnx.numpy_helper as NH
import pytest
from onnx import TensorProto as T
from qbuild_onnx.quantization import selectors
from qbuild_onnx.quantization.options import DynamicOptions
from qbuild_onnx.quantization.preprocess import preprocess_model
from qbuild_onnx.quantization.quantize import quantize_dynamic_model
from qbuild_onnx_common.errors import OnnxError

YOLO = Path(__file__).resolve().parents[2] / "examples" / "yolo" / "yolox_nano.onnx"
# The recipe's stem as node names in the model as exported (onnxruntime 1.31's
# pre-processing merges two of the eight Slices; 1.32's replaces them and Concat_40).
STEM = ["Slice_4", "Slice_24", "Slice_34", "Slice_39", "Slice_29", "Slice_14", "Slice_19",
        "Slice_9", "Concat_40",
        "Conv_41", "Sigmoid_42", "Mul_43", "Conv_44", "Sigmoid_45", "Mul_46", "Conv_47",
        "Sigmoid_48", "Mul_49", "Conv_50", "Sigmoid_51", "Mul_52", "Conv_56", "Sigmoid_57",
        "Mul_58", "Conv_59", "Sigmoid_60", "Mul_61", "Conv_62", "Sigmoid_63", "Mul_64", "Add_65",
        "Conv_53", "Sigmoid_54", "Mul_55", "Concat_66", "Conv_67", "Sigmoid_68", "Mul_69",
        "Conv_70", "Sigmoid_71", "Mul_72", "Conv_73", "Sigmoid_74", "Mul_75"]


@pytest.fixture(scope="module")
def yolo():
    return onnx.load(str(YOLO))


def test_region_up_to_a_tensor_is_the_recipes_stem(yolo):
    got = selectors.resolve_nodes(["upto:729"], yolo, "nodes_to_exclude")
    assert sorted(got) == sorted(STEM)
    # Graph order, whatever the order the selectors were written in.
    order = [n.name for n in yolo.graph.node]
    assert got == sorted(got, key=order.index)


def test_first_weighted_layers_and_everything_before(yolo):
    got = set(selectors.resolve_nodes(["first:11"], yolo, "nodes_to_exclude"))
    assert got == set(STEM) - {"Sigmoid_74", "Mul_75"}  # Conv_73 is the 11th Conv
    last = set(selectors.resolve_nodes(["last:1"], yolo, "nodes_to_exclude"))
    convs = [n.name for n in yolo.graph.node if n.op_type == "Conv"]
    assert convs[-1] in last and not last & set(STEM)


def test_globs_op_types_and_intersections(yolo):
    assert selectors.resolve_nodes(["Slice_*"], yolo, "x") == \
        selectors.resolve_nodes(["op:Slice"], yolo, "x")
    assert len(selectors.resolve_nodes(["op:Slice"], yolo, "x")) == 8
    assert selectors.resolve_nodes(["name:Conv_4?"], yolo, "x") == ["Conv_41", "Conv_44",
                                                                  "Conv_47"]
    both = selectors.resolve_nodes(["op:Conv & upto:729"], yolo, "x")
    assert len(both) == 11 and all(n.startswith("Conv_") for n in both)
    after = set(selectors.resolve_nodes(["after:729"], yolo, "x"))
    assert not after & set(STEM) and len(after) + len(STEM) == len(yolo.graph.node)
    # Exact names and selectors mix; duplicates collapse.
    assert selectors.resolve_nodes(["Conv_41", "op:Slice", "Slice_9"], yolo, "x")[0] == \
        "Slice_4"


@pytest.mark.parametrize("bad,message", [
    ("op:NoSuchOp", "selects no node"),
    ("upto:no_such_tensor", "no tensor named 'no_such_tensor'"),
    ("first:zero", "expected a positive count"),
    ("Conv_9999", "no node named 'Conv_9999'.*docs/selectors.md"),
])
def test_selector_errors_name_the_attribute(yolo, bad, message):
    with pytest.raises(OnnxError, match=message) as err:
        selectors.resolve_nodes([bad], yolo, "nodes_to_exclude")
    assert err.value.attr == "nodes_to_exclude"


def test_tensor_selectors(yolo):
    table = {"op:Sigmoid & upto:729": {"quant_type": "uint16"}, "686": {"quant_type": "int16"}}
    got = selectors.resolve_tensors(table, yolo, "tensor_overrides")
    sigmoids = [n.output[0] for n in yolo.graph.node if n.op_type == "Sigmoid"
                and n.name in STEM]
    assert set(got) == set(sigmoids)
    assert got["686"] == {"quant_type": "int16"}  # an exact name wins over a selector
    assert got["690"] == {"quant_type": "uint16"}
    clash = {"op:Sigmoid": {"quant_type": "uint16"}, "name:69?": {"quant_type": "int16"}}
    with pytest.raises(OnnxError, match="selected by .* with different settings"):
        selectors.resolve_tensors(clash, yolo, "tensor_overrides")


def _conv_bn_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = [NH.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
             NH.from_array(rng.random(4).astype(np.float32) + 0.5, "scale"),
             NH.from_array(rng.standard_normal(4).astype(np.float32), "bias"),
             NH.from_array(rng.standard_normal(4).astype(np.float32), "mean"),
             NH.from_array(rng.random(4).astype(np.float32) + 0.5, "var"),
             NH.from_array(rng.standard_normal((16, 4)).astype(np.float32), "fc")]
    nodes = [H.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             H.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["b"],
                         name="bn"),
             H.make_node("Relu", ["b"], ["r0"], name="relu"),
             H.make_node("Identity", ["r0"], ["r"], name="copy"),
             H.make_node("Reshape", ["r", "shape"], ["f"], name="flatten"),
             H.make_node("MatMul", ["f", "fc"], ["y"], name="head")]
    inits.append(NH.from_array(np.array([1, 16], np.int64), "shape"))
    g = H.make_graph(nodes, "g", [H.make_tensor_value_info("x", T.FLOAT, [1, 3, 4, 4])],
                     [H.make_tensor_value_info("y", T.FLOAT, [1, 4])], inits)
    m = H.make_model(g, opset_imports=[H.make_opsetid("", 13)])
    m.ir_version = 8  # onnx's default IR is newer than onnxruntime 1.31 loads
    return m


def test_a_name_removed_by_preprocessing_is_explained(tmp_path):
    onnx.save(_conv_bn_model(), str(tmp_path / "m.onnx"))
    info = preprocess_model(tmp_path / "m.onnx", tmp_path / "pre.onnx")
    rewrites = info["preprocess_rewrites"]
    # Every onnxruntime release removes the Identity (1.32 also folds the BatchNorm).
    assert rewrites["removed"]["copy"]["op"] == "Identity"
    with pytest.raises(OnnxError) as err:
        quantize_dynamic_model(tmp_path / "pre.onnx", tmp_path / "q.onnx",
                               DynamicOptions(nodes_to_exclude=("copy",)), rewrites=rewrites)
    text = str(err.value)
    assert err.value.attr == "nodes_to_exclude"
    assert "quant_pre_process removed it (Identity x1" in text
    assert "'op:Identity'" in text and "docs/selectors.md" in text
    # The same exclusion written as a selector builds, and keeps the head in float.
    quantize_dynamic_model(tmp_path / "pre.onnx", tmp_path / "q.onnx",
                           DynamicOptions(nodes_to_exclude=("last:1",)), rewrites=rewrites)
    ops = [n.op_type for n in onnx.load(str(tmp_path / "q.onnx")).graph.node]
    assert "MatMul" in ops and "MatMulInteger" not in ops
