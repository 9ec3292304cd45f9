"""qbuild_lower: integer-only lowering of QDQ models (the ``lower_integer`` rule).

A QDQ model from onnxruntime's quantizer still computes in float between its
QuantizeLinear/DequantizeLinear pairs. This plugin rewrites those groups into integer
operators, in one of two modes:

* ``ort``: integer operators that onnxruntime runs (QLinearConv, QLinearMatMul and the
  ``com.microsoft`` QLinear* family); data-movement ops run on the quantized tensors.
* ``fixed_point``: standard ONNX operators only, every rescale an int32 multiplier and a
  rounding right shift (Jacob et al., 2018), with the parameters exported as JSON.

Modules (imported lazily, so that importing this package does not load onnx/numpy):
``graph`` (tensor/consumer index), ``fixedpoint`` (multiplier decomposition, rounding),
``lower_ort`` / ``lower_fixed`` (the two rewriters, sharing ``groups``), ``reference`` (a
numpy integer executor for fixed-point graphs), ``check`` (agreement with the QDQ source),
``qdq_source`` (builds QDQ inputs for tests and the benchmark), ``regions`` / ``fuse``
(element-wise chains between quantized tensors as 256-entry tables, rule ``fuse_lut``),
``profiling`` (interleaved latency, onnxruntime per-op profiles, rule ``profile``) and
``rules`` (the rules).
"""
