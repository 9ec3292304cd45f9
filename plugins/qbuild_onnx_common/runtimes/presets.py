"""Where ``auto_quantize`` places Q/DQ for each target runtime, so that the runtime fuses
them into integer kernels: the one table of it.

* onnxruntime: its quantizer's own placement (``"default"``): a Q/DQ pair around every
  operator onnxruntime has an integer kernel for, SiLU's Sigmoid and Mul included
  (onnxruntime runs them as QLinearSigmoid and QLinearMul).
* openvino: convolution inputs only (``"conv_inputs"``): activations and weights are
  quantized where a Conv, MatMul or Gemm reads them, and nothing else, so SiLU stays
  float between two int8 convolutions and OpenVINO fuses it into the first one's
  epilogue (the placement Intel's NNCF uses). The same file runs about 2x slower on
  onnxruntime, which then computes SiLU in float between unfused Q/DQ: the placement
  that is fast depends on the runtime (docs/runtime-targets.md).
"""

from __future__ import annotations

DEFAULT_PLACEMENT = "default"
CONV_INPUTS = "conv_inputs"

#: runtime name -> the placement ``auto_quantize``'s trials use on it
PLACEMENT = {"onnxruntime": DEFAULT_PLACEMENT, "openvino": CONV_INPUTS}

#: the operators whose inputs the ``conv_inputs`` placement quantizes
CONV_INPUT_OPS = ("Conv", "MatMul", "Gemm")
