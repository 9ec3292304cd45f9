"""Where results live: the local content-addressed store and action cache, the layered
remote cache and its HTTP client, and the key locks. Imports ``core`` and ``api``.
"""
