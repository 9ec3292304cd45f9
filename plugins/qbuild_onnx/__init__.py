"""qbuild's built-in ONNX rules: source models, datasets, pre-processing, calibration,
static and dynamic quantization, and accuracy tools.

Where things are (each area is plain functions over paths, usable without qbuild):

- ``rules/``: the rules users name in BUILD files, one module per entry point
  (``source``, ``quantize``, ``accuracy``; ``auto`` is registered by ``accuracy``).
  Each rule (rule API v2) maps attributes to the params of module-level actions over
  an area's functions, and their results to providers; nothing else.
- ``source/``: ONNX models (load, check, stage) and dataset artifacts (write, read,
  match to a model; image decoding).
- ``calibration/``: running a model over a dataset and choosing tensor ranges.
- ``quantization/``: pre-processing, static and dynamic quantization, their options,
  selectors, validation and reports.
- ``accuracy/``: metrics, evaluation tasks and feeds, sensitivity, range setting, bias
  correction, mixed precision.
- ``auto/``: ``auto_quantize``'s trial plan, region exclusion and selection.
- ``report/``: static HTML reports.
- ``hookspecs.py`` (dataset readers, evaluation tasks other plugins add),
  ``ort_logs.py`` (onnxruntime's log lines into the action log) and ``providers.py``
  (the providers only these rules give and ask for: sensitivity rankings, precision
  overrides, evaluation reports).

What the three ONNX plugins share (providers for models, datasets, calibrations and
quantized models; errors, graph and opset helpers, model summaries, onnxruntime
sessions, file digests, the ``OnnxRule`` base) is in ``qbuild_onnx_common``. Every rule
here declares the providers it gives and asks for them on its label attributes, so a
dependency of the wrong kind is refused at analysis.

The package is registered through the ``qbuild`` entry-point group, exactly as a
third-party plugin would be. Nothing here imports onnx, onnxruntime or numpy at import
time: the actions import them inside, so that start-up and no-op builds stay fast.
"""
