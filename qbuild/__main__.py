"""``python -m qbuild``: the same as the ``qbuild`` command."""

from .cli import run

run()
