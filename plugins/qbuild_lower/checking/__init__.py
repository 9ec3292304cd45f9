"""Checking a lowered model: agreement with its QDQ source in onnxruntime (``compare``),
the inputs it runs on (``feeds``), and an exact numpy executor of fixed-point graphs
(``reference``)."""
