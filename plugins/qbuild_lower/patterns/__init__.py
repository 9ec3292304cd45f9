"""Patterns found in a QDQ graph and rewritten as a whole: element-wise regions between two
quantized tensors (``regions``) replaced by their tables in the fastest form (``fuse``,
tables from ``region_tables``), and YOLOX's Focus slices as SpaceToDepth (``focus``)."""
