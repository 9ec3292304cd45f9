"""The numbers behind the lowering: fixed-point multipliers and requantization defined
exactly in numpy (``fixedpoint``), and lookup tables of 8-bit codes computed by onnxruntime
from DQ -> op -> Q groups (``tables``)."""
