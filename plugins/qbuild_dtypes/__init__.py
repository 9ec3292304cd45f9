"""qbuild's quantization dtype plugin: QDQ form conversion, weight re-quantization and
runtime compatibility.

* ``qdq_retarget`` converts a QDQ model between the zero-point form and the opset-21
  ``output_dtype`` form under a target's policy (onnxruntime CPU, the onnx reference, generic).
* ``requantize_weights`` re-quantizes weights to int2/int4/int8/int16 (signed or not) or
  float8, per tensor, per channel or blocked, from a per-op / per-tensor policy.
* :mod:`qbuild_dtypes.runtime_compat` lowers IR version and opset so that a model loads in the
  target runtime; every plugin that writes models may call it.

Nothing here imports onnx, onnxruntime or numpy at import time: the rules import the
submodules inside ``run`` so that qbuild start-up stays fast.
"""
