"""The internal ONNX layer shared by qbuild's ONNX plugins (qbuild_onnx, qbuild_lower,
qbuild_dtypes). ``providers`` holds the typed providers ONNX rules give and ask for;
built on qbuild's public API only, and importing neither onnx nor onnxruntime itself."""
