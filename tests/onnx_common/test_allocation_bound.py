"""Issue 24, "one trust boundary": a model declaring a huge shape is refused before any
rule allocates it (``qbuild_onnx_common.allocation``), in one line naming the target, the
model file, the tensor or node and the size, never a MemoryError traceback.

The hostile models are made here with ``onnx.helper``: a declared input of 1e6 x 1e6,
a ConstantOfShape, an Expand and a Tile (whose size follows the batch) to such shapes.
The shapes are far beyond any machine's memory (terabytes), so even if the bound broke,
the allocation would fail at once instead of filling a large machine's memory."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from qbuild_onnx_common import allocation
from qbuild_onnx_common.errors import OnnxError

HUGE = 1_000_000
BOUND = {"QBUILD_MAX_TENSOR_BYTES": "4GB"}  # the default depends on the machine


def _save(path, nodes, inputs, outputs, inits=()):
    model = helper.make_model(helper.make_graph(nodes, path.stem, inputs, outputs,
                                                list(inits)),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)  # valid models, only hostile sizes
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def _io(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def _sum_into_output(source, nodes, out_type=TensorProto.FLOAT):
    """Nodes reducing ``source`` to a scalar added to x: the bomb feeds the output."""
    cast = [] if out_type == TensorProto.FLOAT else [
        helper.make_node("Cast", ["s0"], ["s"], name="cast", to=TensorProto.FLOAT)]
    return [*nodes,
            helper.make_node("ReduceSum", [source], ["s0" if cast else "s"], name="sum",
                             keepdims=0),
            *cast, helper.make_node("Add", ["x", "s"], ["y"], name="add")]


def big_input(path):
    return _save(path, [helper.make_node("Relu", ["x"], ["y"], name="relu")],
                 [_io("x", [1, HUGE, HUGE])], [_io("y", [1, HUGE, HUGE])])


def constant_of_shape_bomb(path, elem=TensorProto.DOUBLE, size=HUGE):
    shape = numpy_helper.from_array(np.array([size, size], np.int64), "bomb_shape")
    value = helper.make_tensor("v", elem, [1], [1])
    nodes = _sum_into_output("b", [helper.make_node("ConstantOfShape", ["bomb_shape"], ["b"],
                                                    name="bomb", value=value)], elem)
    return _save(path, nodes, [_io("x", [1, 4])], [_io("y", [1, 4])], [shape])


def expand_bomb(path):
    one = numpy_helper.from_array(np.array([1.0], np.float32), "one")
    shape = numpy_helper.from_array(np.array([HUGE, HUGE], np.int64), "expand_shape")
    nodes = _sum_into_output("b", [helper.make_node("Expand", ["one", "expand_shape"], ["b"],
                                                    name="boom")])
    return _save(path, nodes, [_io("x", [1, 4])], [_io("y", [1, 4])], [one, shape])


def tile_by_batch_bomb(path):
    """x is [N, 4]: Tile(x, [HUGE, HUGE // 4]) is only known to be huge once N is."""
    repeats = numpy_helper.from_array(np.array([HUGE, HUGE // 4], np.int64), "repeats")
    nodes = _sum_into_output("t", [helper.make_node("Tile", ["x", "repeats"], ["t"],
                                                    name="tile")])
    return _save(path, nodes, [_io("x", ["N", 4])], [_io("y", ["N", 4])], [repeats])


# -- the module on its own ----------------------------------------------------------------
def test_each_hostile_model_is_refused_naming_its_node_and_size(tmp_path, monkeypatch):
    monkeypatch.setenv("QBUILD_MAX_TENSOR_BYTES", "4GB")
    cases = [
        (big_input(tmp_path / "in.onnx"), "input 'x' (float32 [1, 1000000, 1000000]) would "
         "allocate 3.6 TB (limit 4.0 GB; QBUILD_MAX_TENSOR_BYTES raises it)"),
        (constant_of_shape_bomb(tmp_path / "c.onnx"), "ConstantOfShape node 'bomb' (output "
         "'b': float64 [1000000, 1000000]) would allocate 7.3 TB"),
        (expand_bomb(tmp_path / "e.onnx"), "Expand node 'boom' (output 'b': float32 "
         "[1000000, 1000000]) would allocate 3.6 TB"),
    ]
    for path, message in cases:
        with pytest.raises(allocation.AllocationRefused) as caught:
            allocation.check_model(path)
        assert message in str(caught.value)
        assert caught.value.file == str(path)
        with pytest.raises(allocation.AllocationRefused):  # the model itself, in memory
            allocation.check_model(onnx.load(str(path)))


def test_a_size_that_follows_the_batch_is_checked_at_the_batch_it_runs_with(tmp_path,
                                                                            monkeypatch):
    monkeypatch.setenv("QBUILD_MAX_TENSOR_BYTES", "4GB")
    path = tile_by_batch_bomb(tmp_path / "t.onnx")
    allocation.check_model(path)  # [N * 1e6, 250000]: not known before N is
    with pytest.raises(allocation.AllocationRefused, match=r"Tile node 'tile' \(output 't': "
                       r"float32 \[1000000, 1000000\]\) would allocate 3\.6 TB"):
        allocation.check_model(path, inputs={"x": (1, 4)})


def test_the_bound_is_set_by_one_variable(monkeypatch, tmp_path):
    path = constant_of_shape_bomb(tmp_path / "small.onnx", TensorProto.FLOAT, 4096)  # 64 MB
    monkeypatch.delenv("QBUILD_MAX_TENSOR_BYTES", raising=False)
    memory = allocation.physical_memory()
    assert allocation.limit() == (allocation.DEFAULT if memory is None
                                  else min(allocation.DEFAULT, memory // 2))
    allocation.check_model(path)
    for text, size in (("16MB", 16 << 20), ("1.5 GB", 3 << 29), ("1073741824", 1 << 30),
                       ("2gib", 2 << 30)):
        monkeypatch.setenv("QBUILD_MAX_TENSOR_BYTES", text)
        assert allocation.limit() == size
    monkeypatch.setenv("QBUILD_MAX_TENSOR_BYTES", "16MB")
    with pytest.raises(allocation.AllocationRefused, match=r"would allocate 64\.0 MB \(limit "
                       r"16\.0 MB"):
        allocation.check_model(path)  # (the file passed under the default: not memoised
    monkeypatch.setenv("QBUILD_MAX_TENSOR_BYTES", "none")  # for another bound)
    assert allocation.limit() is None
    allocation.check_model(path)
    monkeypatch.setenv("QBUILD_MAX_TENSOR_BYTES", "lots")
    with pytest.raises(OnnxError, match="QBUILD_MAX_TENSOR_BYTES='lots' is not a size"):
        allocation.limit()


def test_a_feed_is_bounded_as_a_whole():
    allocation.check_arrays("input", {"a": (np.float32, [1024, 1024])})
    with pytest.raises(allocation.AllocationRefused, match=r"inputs 'a', 'b' together would "
                       r"allocate 8\.0 MB \(limit 6\.0 MB"):
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("QBUILD_MAX_TENSOR_BYTES", "6MB")
            allocation.check_arrays("input", {"a": (np.float32, [1024, 1024]),
                                              "b": (np.float32, [1024, 1024])})


# -- through the real command line --------------------------------------------------------
BUILD = """
[big]
rule = "onnx_model"
src = "big.onnx"

[big_data]
rule = "synthetic_dataset"
model = ":big"
count = 2

[cos]
rule = "onnx_model"
src = "cos.onnx"

[cos64]
rule = "onnx_model"
src = "cos64.onnx"

[cos_data]
rule = "synthetic_dataset"
model = ":cos"
count = 2

[cos_calib]
rule = "calibrate"
model = ":cos"
dataset = ":cos_data"

[cos_pre]
rule = "quant_preprocess"
model = ":cos64"

[cos_retarget]
rule = "qdq_retarget"
model = ":cos"

[expand]
rule = "onnx_model"
src = "expand.onnx"

[expand_data]
rule = "synthetic_dataset"
model = ":expand"
count = 2

[expand_calib]
rule = "calibrate"
model = ":expand"
dataset = ":expand_data"

[expand_eval]
rule = "evaluate"
reference = ":expand"
models = [":expand"]
dataset = ":expand_data"

[expand_lower]
rule = "lower_integer"
model = ":expand"

[tile]
rule = "onnx_model"
src = "tile.onnx"

[tile_data]
rule = "synthetic_dataset"
model = ":tile"
count = 2

[tile_calib]
rule = "calibrate"
model = ":tile"
dataset = ":tile_data"
"""

LIMIT = "(limit 4.0 GB; QBUILD_MAX_TENSOR_BYTES raises it)"
EXPECTED = {
    "big_data": ("qbuild-out/m/@big/big.onnx", "input 'x' (float32 [1000000, 1000000]) would "
                 "allocate 3.6 TB"),
    "cos_calib": ("qbuild-out/m/@cos/cos.onnx", "ConstantOfShape node 'bomb' (output 'b': "
                  "float64 [1000000, 1000000]) would allocate 7.3 TB"),
    "cos_pre": ("qbuild-out/m/@cos64/cos64.onnx", "ConstantOfShape node 'bomb' (output 'b': "
                "int64 [1000000, 1000000]) would allocate 7.3 TB"),
    "cos_retarget": ("qbuild-out/m/@cos/cos.onnx", "ConstantOfShape node 'bomb' (output 'b': "
                     "float64 [1000000, 1000000]) would allocate 7.3 TB"),
    "expand_calib": ("qbuild-out/m/@expand/expand.onnx", "Expand node 'boom' (output 'b': "
                     "float32 [1000000, 1000000]) would allocate 3.6 TB"),
    "expand_lower": ("qbuild-out/m/@expand/expand.onnx", "Expand node 'boom' (output 'b': "
                     "float32 [1000000, 1000000]) would allocate 3.6 TB"),
    "tile_calib": ("qbuild-out/m/@tile/tile.onnx", "Tile node 'tile' (output 't': float32 "
                   "[1000000, 1000000]) would allocate 3.6 TB"),
}


def test_hostile_models_fail_in_one_line_each_through_the_cli(qbuild_workspace):
    ws = qbuild_workspace
    big_input(ws.root / "m/big.onnx")
    constant_of_shape_bomb(ws.root / "m/cos.onnx")
    constant_of_shape_bomb(ws.root / "m/cos64.onnx", TensorProto.INT64)
    expand_bomb(ws.root / "m/expand.onnx")
    tile_by_batch_bomb(ws.root / "m/tile.onnx")
    ws.write("m/BUILD.toml", BUILD)
    targets = [f"//m:{name}" for name in (*EXPECTED, "expand_eval")]
    out = ws.cli("build", "--keep_going", *targets, env=BOUND)
    assert out.code == 1, out.stderr
    text = out.stdout + out.stderr
    for bad in ("Traceback", "MemoryError", "Failed to allocate", "internal error"):
        assert bad not in text, text
    summary = [line for line in out.stderr.splitlines() if line.startswith("  failed: ")]
    for name, (model, what) in EXPECTED.items():
        lines = [line for line in summary if line.startswith(f"  failed: //m:{name} ")]
        assert len(lines) == 1, (name, summary)
        # (a target of several actions names the one that refused: "action Lower: ")
        assert re.search(f": {re.escape(model)}, target //m:{name}, attribute 'model': "
                         f"(action [A-Za-z]+: )?{re.escape(what)} {re.escape(LIMIT)}$",
                         lines[0]), lines[0]
    # evaluate names the reference (checked first), an attribute of its own
    (line,) = [line for line in summary if line.startswith("  failed: //m:expand_eval ")]
    assert line.endswith(": qbuild-out/m/@expand/expand.onnx, target //m:expand_eval, "
                         "attribute 'reference': action Evaluate: Expand node 'boom' (output "
                         "'b': float32 [1000000, 1000000]) would allocate 3.6 TB " + LIMIT), line


SMALL = """
[cos]
rule = "onnx_model"
src = "cos.onnx"

[cos_data]
rule = "synthetic_dataset"
model = ":cos"
count = 2

[cos_calib]
rule = "calibrate"
model = ":cos"
dataset = ":cos_data"
"""


def test_the_bound_can_be_raised_and_lowered_for_a_build(qbuild_workspace):
    ws = qbuild_workspace
    constant_of_shape_bomb(ws.root / "m/cos.onnx", TensorProto.FLOAT, 4096)  # 64 MB
    ws.write("m/BUILD.toml", SMALL)
    low = ws.cli("build", "//m:cos_calib", env={"QBUILD_MAX_TENSOR_BYTES": "16MB"})
    assert low.code == 1, low.stderr
    assert ("target //m:cos_calib, attribute 'model': ConstantOfShape node 'bomb' (output "
            "'b': float32 [4096, 4096]) would allocate 64.0 MB (limit 16.0 MB; "
            "QBUILD_MAX_TENSOR_BYTES raises it)") in low.stderr
    ok = ws.cli("build", "//m:cos_calib", env={"QBUILD_MAX_TENSOR_BYTES": "1GB"})
    assert ok.code == 0, ok.stderr


def test_a_dataset_manifest_is_believed_only_as_far_as_its_files_go(tmp_path, monkeypatch):
    """dataset.json only declares shapes (a saved_dataset's is written by hand): a batch
    is bounded before it is allocated, and read only if its bytes are in the file."""
    import json

    from qbuild_onnx.source.datasets import open_dataset, write_dataset

    monkeypatch.setenv("QBUILD_MAX_TENSOR_BYTES", "4GB")
    write_dataset(tmp_path / "d", {"x": np.ones((2, 8), np.float32)})
    manifest = json.loads((tmp_path / "d/dataset.json").read_text())
    for shape, error in (([2, HUGE, HUGE], r"a batch of input 'x' \(float32 \[2, 1000000, "
                                           r"1000000\]\) would allocate 7\.3 TB"),
                         ([2, 4096], "dataset file input_0.npy is truncated")):
        manifest["inputs"]["x"]["shape"] = shape
        (tmp_path / "d/dataset.json").write_text(json.dumps(manifest))
        with pytest.raises(OnnxError, match=error):
            next(open_dataset(tmp_path / "d").iter_batches(2))
