"""What a runtime loads and runs: dtype targets (``targets``, pure Python so that rules
resolve them at analysis), facts measured on the installed onnxruntime (``ort_probe``),
the Q/DQ types each target runs (``qdq_support``), and lowering IR version and opset until
a target loads the model (``compat``).
"""
