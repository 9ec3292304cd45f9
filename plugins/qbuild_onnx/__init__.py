"""qbuild's built-in ONNX rules: source models, datasets, pre-processing, calibration,
static and dynamic quantization, and accuracy tools.

The package is registered through the ``qbuild`` entry-point group, one entry point per
rules module, exactly as a third-party plugin would be. Nothing here imports onnx,
onnxruntime or numpy at import time: rules import them inside ``run`` so that start-up
and no-op builds stay fast.
"""
