"""The transformations behind the rules: QDQ form conversion under a target's policies
(``forms``), weight (re-)quantization (``requantize``), and both end to end from file to
file with validation and a report (``pipeline``).
"""
