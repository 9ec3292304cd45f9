"""The internal ONNX layer shared by qbuild's ONNX plugins (qbuild_onnx, qbuild_lower,
qbuild_dtypes), built on qbuild's public API only; a library, not a plugin.

``providers`` (the typed providers ONNX rules give and ask for), ``errors`` (the one
error type), ``rule`` (the ``OnnxRule`` base class), ``models`` (loading models, external
data files kept on disk), ``graph`` (attributes, opsets, IR version, inputs, readers, the
``GraphIndex``), ``summary`` (model and value descriptions), ``ort``
(onnxruntime sessions), ``runtimes`` (the target runtimes models run and are timed on:
onnxruntime and OpenVINO), ``allocation`` (the bound on what a rule allocates for a shape
a model declares), ``latency`` (fair timing), ``files`` (digests). onnx is imported
only inside the functions that read models, so importing the package stays cheap.
"""
