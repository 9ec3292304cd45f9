"""qbuild's quantization dtype plugin: QDQ form conversion, weight re-quantization and
runtime compatibility.

* ``qdq_retarget`` converts a QDQ model between the zero-point form and the opset-21
  ``output_dtype`` form under a target's policy (onnxruntime CPU, the onnx reference, generic).
* ``requantize_weights`` re-quantizes weights to int2/int4/int8/int16 (signed or not) or
  float8, per tensor, per channel or blocked, from a per-op / per-tensor policy.
* :mod:`qbuild_dtypes.runtime.compat` lowers IR version and opset so that a model loads in
  the target runtime; every plugin that writes models may call it.

Where things are (each package imports only from the ones listed before it):

- ``numerics/``: quantized element types (``qtypes``) and the QuantizeLinear /
  DequantizeLinear arithmetic in numpy (``arithmetic``).
- ``graph/``: reading and editing ModelProtos (``reading``, ``editing``) and the Q/DQ nodes
  of a model with their effective parameters and the equivalence proof (``qdq``).
- ``validation/``: onnx's full checker, load-and-run in onnxruntime or the reference
  evaluator, onnxruntime's fused graph (``checks``) and report.json summaries (``report``).
- ``runtime/``: dtype targets (``targets``), facts measured on the installed onnxruntime
  (``ort_probe``), the Q/DQ types a target runs (``qdq_support``) and IR / opset lowering
  until a target loads a model (``compat``).
- ``conversion/``: QDQ form conversion (``forms``), weight (re-)quantization
  (``requantize``) and both end to end, file to file (``pipeline``).
- ``rules.py``: the entry point (``qdq_retarget``, ``requantize_weights``);
  ``hookspecs.py``: the ``qbuild_dtype_targets`` hook other plugins implement.

Nothing here imports onnx, onnxruntime or numpy at import time: the rules import the
conversion modules inside their actions so that qbuild start-up stays fast.
"""
