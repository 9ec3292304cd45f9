"""qbuild_lower: integer-only lowering of QDQ models (the ``lower_integer`` rule).

A QDQ model from onnxruntime's quantizer still computes in float between its
QuantizeLinear/DequantizeLinear pairs. This plugin rewrites those groups into integer
operators, in one of two modes:

* ``ort``: integer operators that onnxruntime runs (QLinearConv, QLinearMatMul and the
  ``com.microsoft`` QLinear* family); data-movement ops run on the quantized tensors.
* ``fixed_point``: standard ONNX operators only, every rescale an int32 multiplier and a
  rounding right shift (Jacob et al., 2018), with the parameters exported as JSON.

Layout, each sub-package importing only the ones listed before it (no import cycles):

* ``qdq/``: the QDQ source as read: ``graph`` (tensor/consumer index, quantization
  parameters, topological sort), ``groups`` (DQ -> op -> Q groups and why a node stays in
  float), ``source`` (QDQ models made with onnxruntime's quantizer, for tests and benches).
* ``arithmetic/``: ``fixedpoint`` (multiplier decomposition, requantization defined
  exactly) and ``tables`` (8-bit lookup tables computed by onnxruntime).
* ``emit/``: building the lowered graph: ``builder`` (new nodes, constants, fresh names),
  ``quantized`` (data movement and tables on the codes), ``requantize`` (the integer
  requantization tail, bias codes), ``assemble`` (the output model).
* ``patterns/``: rewrites of whole sub-graphs: element-wise ``regions`` between two
  quantized tensors, their ``region_tables``, ``fuse`` (regions as tables in the fastest
  form, rule ``fuse_lut``) and ``focus`` (YOLOX's Focus slices as SpaceToDepth).
* ``lowering/``: ``driver.lower_model`` and the handlers of the two modes, ``ort`` and
  ``fixed_point`` (with ``accumulator`` and ``records``, its parameter records).
* ``checking/``: ``compare`` (agreement with the QDQ source in onnxruntime), ``feeds``
  (dataset or seeded random inputs) and ``reference`` (an exact numpy executor of
  fixed-point graphs).
* ``profiling/``: ``timing`` (interleaved latency, onnxruntime per-op profiles), ``macs``
  and ``report`` (report.md of rule ``profile``); independent of the rest.
* ``rules/``: the rules (the entry point loads ``qbuild_lower.rules``); the only modules
  importing qbuild.

Importing this package or ``rules`` does not load onnx, onnxruntime or numpy; the other
modules import them at the top.
"""
