"""Emitting the lowered graph: the ``Builder`` that collects new nodes and constants
(``builder``), the emitters both modes share (``quantized``: data movement and lookup
tables on the codes; ``requantize``: the integer requantization tail, bias codes) and the
final assembly of a model from kept and emitted nodes (``assemble``)."""
