"""Accuracy: evaluating candidates against a reference, sensitivity, range setting, bias
correction and mixed precision.
"""
