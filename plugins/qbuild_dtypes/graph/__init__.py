"""Reading and editing ModelProtos: walking graphs, constants and inferred types
(``reading``), attribute and name edits (``editing``), and every Q/DQ node with its
effective parameters (``qdq``).
"""
