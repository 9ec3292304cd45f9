"""The vocabulary every layer shares: errors, labels, the typed records, the Store and
Executor protocols, TOML reading, file hashing and copying. Imports nothing else of
qbuild.
"""
