"""Checks on written models (onnx's full checker, load-and-run in onnxruntime or the onnx
reference evaluator, onnxruntime's fused graph) and the model summaries in report.json.
"""
