"""onnxruntime's quantization pre-processing for a model whose weights are external data,
with the weights never loaded into Python.

onnxruntime's ``quant_pre_process`` loads the whole model with onnx, runs symbolic shape
inference on it, saves it again and then opens it in an onnxruntime session while still
holding it: two to three times the model's size in memory, and a model over 2 GB fails
where a step serializes it. The same three steps here: symbolic shape inference on the
graph alone (``external_data.lean_load``: only small tensors loaded), onnxruntime's
basic-level optimisation through a session opened by path on a staged copy whose data
files are hard links to the originals (the optimised model's weights are written to
a new external data file), and ONNX shape inference by path
(``onnx.shape_inference.infer_shapes_path``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from qbuild_onnx_common.models import (
    fill,
    lean_load,
    load_model,
    rename_data_file,
    stage_beside,
    unstage,
)

if TYPE_CHECKING:
    from ..quantization.options import PreprocessOptions


def quant_pre_process_external(src: Path, out: Path, opts: PreprocessOptions, data_name: str
                               ) -> None:
    """Pre-process ``src`` into ``out`` with its weights in ``out.parent / data_name``.
    ``opts``: the pre-processing options."""
    import onnx
    import onnxruntime as ort

    src, out = Path(src), Path(out)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".pre.") as tmp_name:
        tmp = Path(tmp_name)
        model = lean_load(src)
        if not opts.skip_symbolic_shape:
            from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

            model = SymbolicShapeInference.infer_shapes(model, opts.int_max, opts.auto_merge,
                                                        opts.guess_output_rank, opts.verbose)
        current = stage_beside(model, src.parent, tmp, "staged.onnx")
        del model
        owns_data = False
        if not opts.skip_optimization:
            so = ort.SessionOptions()
            so.optimized_model_filepath = str(tmp / "optimized.onnx")
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
            so.log_severity_level = 3
            so.add_session_config_entry(
                "session.optimized_model_external_initializers_file_name",
                "optimized.onnx.data")
            so.add_session_config_entry(
                "session.optimized_model_external_initializers_min_size_in_bytes", "1024")
            sess = ort.InferenceSession(str(current), so, providers=["CPUExecutionProvider"])
            del sess
            unstage(current)
            current, owns_data = tmp / "optimized.onnx", True
        if not opts.skip_onnx_shape:
            inferred = tmp / "inferred.onnx"
            onnx.shape_inference.infer_shapes_path(str(current), str(inferred))
            current = inferred
        if owns_data:
            rename_data_file(current, data_name)
            os.replace(current, out)
            data = tmp / data_name
            if data.exists():
                os.replace(data, out.parent / data_name)
        else:
            # the staged graph still points at the original files (hard links): write
            # a real copy of the weights beside the output
            proto = load_model(current, external_data=False)
            unstage(tmp / "staged.onnx")  # onnx reads no file with two hard links
            fill(proto, src.parent)
            onnx.save(proto, str(out), save_as_external_data=True,
                      all_tensors_to_one_file=True, location=data_name, size_threshold=1024)
            del proto
        shutil.rmtree(tmp, ignore_errors=True)
