"""The QDQ source as the lowering reads it: the tensor-level graph index and quantization
parameters (``graph``), DQ -> op -> Q groups and why a node stays in float (``groups``),
and building QDQ models with onnxruntime's quantizer for tests and benchmarks
(``source``)."""
