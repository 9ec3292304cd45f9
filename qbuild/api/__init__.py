"""The rule author's API: ``Rule``, attribute schemas, providers, declared actions and
hook calls. Imports only ``core``; re-exported by the ``qbuild`` top level.
"""
