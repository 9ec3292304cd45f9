"""The internal ONNX layer shared by qbuild's ONNX plugins (qbuild_onnx, qbuild_lower,
qbuild_dtypes). ``providers`` holds the typed providers ONNX rules give and ask for;
built on qbuild's public API only; onnx is imported only inside the functions that
read models, so importing the package stays cheap."""
