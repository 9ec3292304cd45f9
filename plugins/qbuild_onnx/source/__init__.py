"""Source models and datasets: loading, checking and staging ONNX models; building, reading and
matching dataset artifacts.
"""
