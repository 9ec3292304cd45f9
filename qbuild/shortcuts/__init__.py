"""Paths that answer without doing the work again: the no-op fast path, the analysis
cache and the incremental path. Each answers only from facts the full path records.
"""
