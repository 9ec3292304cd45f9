"""Everything that enters an action key: the key parts, code digests, machine and
toolchain facts.
"""
