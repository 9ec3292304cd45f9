"""Quantization algorithms beyond min/max calibration, each one cached step of its own.

* ``cle``: cross-layer equalization of Conv -> (Relu / LeakyRelu / Clip) -> Conv chains
  (a float-to-float graph transform before calibration);
* ``smoothquant``: SmoothQuant for MatMul / Gemm (activation outliers migrated into the
  weights, measured on data; float to float, before calibration);
* ``adaround``: learned rounding of a QDQ model's int8 Conv / Gemm / MatMul weights,
  layer by layer on calibration data (numpy only);
* ``int4``: blocked 4-bit (2/8) weights through onnxruntime's MatMulNBits quantizer;
* ``layer_data``: running a float or QDQ model and keeping per-layer samples;
* ``rules``: the ``equalize``, ``adaround`` and ``quantize_weights_int4`` rules.

Nothing here is imported when the rules are loaded: onnx, onnxruntime and numpy are
imported inside the functions.
"""
