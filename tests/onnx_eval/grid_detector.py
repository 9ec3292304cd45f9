"""Small real ONNX detectors whose output is already decoded, built with onnx.helper for
the labelled-metric and decoder tests (a uniquely named module).

``grid_detector`` reads an RGB image [1, 3, S, S] (values 0..1) in cells of ``cell``
pixels and writes one decoded row per cell, [1, cells, 5 + 2] in layout xywh_obj_cls:
the cell's centre and size in input pixels (a constant grid, plus ``shift`` pixels on
x), objectness = the cell's mean brightness over the three channels, class 0 = its mean
red, class 1 = its mean green. A pure red square filling a cell is therefore detected
exactly, as class 0 with score 1/3 x 1. ``transposed`` writes [1, 7, cells] instead,
``corners`` x1, y1, x2, y2 instead of cx, cy, w, h.

``fastestdet_decoded`` has the shape of a FastestDet export with its decoding in the
graph: input [1, 3, 22, 22], output [1, 484, 85] (one row per cell of the 22 x 22
grid: cx, cy, w, h normalised to the input, objectness, 80 classes).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _model(nodes, inits, size: int, out_shape: list[int], name: str) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, name, [helper.make_tensor_value_info("images", TensorProto.FLOAT,
                                                    [1, 3, size, size])],
        [helper.make_tensor_value_info("dets", TensorProto.FLOAT, out_shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def grid_detector(size: int = 32, cell: int = 8, shift: float = 0.0,
                  transposed: bool = False, corners: bool = False) -> onnx.ModelProto:
    n = size // cell
    fields = 7
    w = np.zeros((fields, 3, cell, cell), np.float32)
    w[4] = 1.0 / (3 * cell * cell)         # objectness: mean brightness
    w[5, 0] = 1.0 / (cell * cell)          # class 0: mean red
    w[6, 1] = 1.0 / (cell * cell)          # class 1: mean green
    grid = np.zeros((1, fields, n, n), np.float32)
    gy, gx = np.mgrid[0:n, 0:n].astype(np.float32)
    cx, cy = gx * cell + cell / 2 + shift, gy * cell + cell / 2
    if corners:
        grid[0, 0], grid[0, 1] = cx - cell / 2, cy - cell / 2
        grid[0, 2], grid[0, 3] = cx + cell / 2, cy + cell / 2
    else:
        grid[0, 0], grid[0, 1], grid[0, 2], grid[0, 3] = cx, cy, cell, cell
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(grid, "grid"),
             numpy_helper.from_array(np.asarray([1, fields, n * n], np.int64), "shape")]
    nodes = [helper.make_node("Conv", ["images", "w"], ["cells"], kernel_shape=[cell, cell],
                              strides=[cell, cell]),
             helper.make_node("Add", ["cells", "grid"], ["decoded"]),
             helper.make_node("Reshape", ["decoded", "shape"],
                              ["dets" if transposed else "rows"])]
    if not transposed:
        nodes.append(helper.make_node("Transpose", ["rows"], ["dets"], perm=[0, 2, 1]))
    shape = [1, fields, n * n] if transposed else [1, n * n, fields]
    return _model(nodes, inits, size, shape, "grid_detector")


def fastestdet_decoded(seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    n, fields = 22, 85
    w = np.zeros((fields, 3, 1, 1), np.float32)
    w[4] = 1.0 / 3                                   # objectness: brightness
    w[5:, :, 0, 0] = rng.uniform(0, 0.1, (80, 3))   # classes: dim, seeded
    w[5 + 16, 0] = 1.0                               # class 16: red
    grid = np.zeros((1, fields, n, n), np.float32)
    gy, gx = np.mgrid[0:n, 0:n].astype(np.float32)
    grid[0, 0], grid[0, 1] = (gx + 0.5) / n, (gy + 0.5) / n
    grid[0, 2] = grid[0, 3] = 3.0 / n
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(grid, "grid"),
             numpy_helper.from_array(np.asarray([1, fields, n * n], np.int64), "shape")]
    nodes = [helper.make_node("Conv", ["images", "w"], ["cells"], kernel_shape=[1, 1]),
             helper.make_node("Add", ["cells", "grid"], ["decoded"]),
             helper.make_node("Reshape", ["decoded", "shape"], ["rows"]),
             helper.make_node("Transpose", ["rows"], ["dets"], perm=[0, 2, 1])]
    return _model(nodes, inits, n, [1, n * n, fields], "fastestdet_decoded")


def save(model: onnx.ModelProto, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(path))
    return path


def run(model: onnx.ModelProto, image: np.ndarray) -> dict[str, np.ndarray]:
    """The model's outputs on one [1, 3, S, S] image, through onnxruntime."""
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return {"dets": sess.run(["dets"], {"images": image.astype(np.float32)})[0]}
