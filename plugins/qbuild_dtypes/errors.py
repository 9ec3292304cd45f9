"""The plugin's error type: one clear message naming the tensor, node or attribute at fault.

Rules turn it into ``qbuild.RuleError`` via ``ctx.fail``; library callers can catch it as a
``ValueError``.
"""


class DtypeError(ValueError):
    """A model or request this plugin cannot handle as asked."""
