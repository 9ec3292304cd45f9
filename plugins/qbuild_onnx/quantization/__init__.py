"""Quantization: pre-processing, static quantization from saved ranges and dynamic
quantization, their options, checks and reports.
"""
