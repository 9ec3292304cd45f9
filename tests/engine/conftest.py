"""Engine tests use the toy plugin; every workspace registers it."""

import pytest
import toy_rules


@pytest.fixture
def ws(qbuild_workspace):
    qbuild_workspace.register(toy_rules)
    return qbuild_workspace
