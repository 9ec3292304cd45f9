"""What the command line offers beside ``build``: query, aquery, graph, explain,
outputs and info.
"""
