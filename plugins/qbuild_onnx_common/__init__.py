"""The internal ONNX layer shared by qbuild_onnx, qbuild_dtypes and qbuild_lower."""
