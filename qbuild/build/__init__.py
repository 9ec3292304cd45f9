"""One build: the plan, the scheduler, rebuilding misses, placing outputs, the
workspace state, progress reporting, the build run and the session that wires them.
"""
