"""Calibration: running a float model over a dataset and turning the collected statistics into
tensor ranges.
"""
