"""From BUILD files to a target graph: the workspace, the loader, globs, the plugin
registry, the analysed graph and the record of what analysis read.
"""
