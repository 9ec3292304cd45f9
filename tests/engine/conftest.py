"""Engine tests use the toy plugin (every workspace registers it) and can spy on what
the incremental path reused."""

import pytest
import toy_rules

from qbuild.shortcuts import incremental as _incremental


@pytest.fixture
def ws(qbuild_workspace):
    qbuild_workspace.register(toy_rules)
    return qbuild_workspace


@pytest.fixture
def reused(monkeypatch):
    """Labels the incremental path reused in the last build (a spy on the real code:
    the targets reused before planning and those reused as they were planned)."""
    seen: list[str] = []
    take = _incremental.Reuse.take

    def spy(self, label, deps, results):
        found = take(self, label, deps, results)
        if found is not None:
            seen.append(str(label))
        return found

    untouched = _incremental.Reuse.untouched

    def spy_untouched(self, order, targets):
        found = untouched(self, order, targets)
        seen.extend(str(label) for label in found)
        return found

    monkeypatch.setattr(_incremental.Reuse, "take", spy)
    monkeypatch.setattr(_incremental.Reuse, "untouched", spy_untouched)
    return seen
