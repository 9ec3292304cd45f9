"""A test plugin implementing ``hook_host``'s ``qbuild_greetings`` hook."""

from qbuild import hookimpl


@hookimpl
def qbuild_greetings() -> list[str]:
    return ["hello"]
