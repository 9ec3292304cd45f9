"""The rules of the qbuild_onnx plugin, one module a plugin entry point; each is a thin layer
over its area's functions.
"""
