"""Where ``auto_quantize`` places Q/DQ for each target runtime, so that the runtime fuses
them into integer kernels: the one table of it (the names are ``quantize``'s
``placement`` values).

* onnxruntime: its quantizer's own placement (``"around_ops"``): a Q/DQ pair around every
  operator onnxruntime has an integer kernel for, SiLU's Sigmoid and Mul included
  (onnxruntime runs them as QLinearSigmoid and QLinearMul).
* openvino: convolution inputs only (``"conv_inputs"``): activations and weights are
  quantized where a Conv, MatMul or Gemm reads them, and nothing else, so SiLU stays
  float between two int8 convolutions and OpenVINO fuses it into the first one's
  epilogue (the placement Intel's NNCF uses). On YOLOX-Nano that file takes 0.75x
  fp32's time on OpenVINO and 2.2x on onnxruntime, which then computes SiLU in float
  between unfused Q/DQ: the placement that is fast depends on the runtime
  (docs/runtime-targets.md).
"""

from __future__ import annotations

AROUND_OPS = "around_ops"
CONV_INPUTS = "conv_inputs"

#: runtime name -> the placement ``auto_quantize``'s trials use on it
PLACEMENT = {"onnxruntime": AROUND_OPS, "openvino": CONV_INPUTS}

