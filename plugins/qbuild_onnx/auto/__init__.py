"""``auto_quantize``: planning its trials, excluding sensitive regions and selecting the
winner.
"""
