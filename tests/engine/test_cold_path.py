"""The cold path's shortcuts: requested outputs are placed in the action's thread as
soon as each action ends (kept only if that is still the target's result at the end),
and ready targets are keyed while actions run."""

import threading

import pytest

from qbuild.build import materialize as _materialize
from qbuild.build import outcomes as _outcomes
from qbuild.build import rebuild as _rebuild
from qbuild.core.files import has_reflinks


def test_a_target_rebuilt_to_new_bytes_after_it_was_placed_is_placed_again(ws):
    """``n`` runs and is placed at once; ``v`` then edits its hard-linked input (``n``'s
    blob, discarded for it), so ``w`` has ``n`` run again, to new bytes (it is not
    reproducible): the output folder must hold those, the ones ``w`` read."""
    (ws.cache_dir / "tmp").mkdir(parents=True, exist_ok=True)
    if has_reflinks(ws.cache_dir / "tmp"):
        pytest.skip("inputs are clones here, not links to the blob")
    ws.write("p/BUILD.toml", """
[n]
rule = "noisy"

[v]
rule = "command"
srcs = [":n"]
cmd = "chmod u+w $(SRCS) && echo evil >> $(SRCS) && echo done > $(OUT)"
outs = ["v.txt"]

[after_v]
rule = "command"
srcs = [":v"]
cmd = "cat $(SRCS) > $(OUT)"
outs = ["x.txt"]

[w]
rule = "command"
srcs = [":n"]
cmd = "cat $(SRCS) > $(OUT)"
outs = ["w.txt"]
""")
    result = ws.build("//p:n", "//p:w", "//p:after_v", jobs=1, keep_going=True)
    assert "modified while the action ran" in result.failed["//p:v"]
    assert result.output("//p:n").read_text() == result.output("//p:w").read_text()


def test_outputs_are_placed_while_other_actions_run_and_keying_overlaps_them(
        ws, monkeypatch):
    """Spies on the real code: the first action is handed to a thread before the last
    target is keyed (the scheduler's own order, in the main thread), and outputs are
    placed in the actions' threads."""
    for i in range(20):
        ws.write(f"p/f{i}.txt", f"{i}\n")
    ws.write("p/BUILD.toml", "\n".join(
        f'[g{i}]\nrule = "filegroup"\nsrcs = ["f{i}.txt"]\n' for i in range(20)))
    events: list[tuple[str, str]] = []
    prepare, submit = _outcomes.Outcomes.prepare, _rebuild.Rebuilder.submit
    place_early = _materialize.Materializer.place_early

    def spy_prepare(self, label):
        events.append(("keyed", str(label)))
        return prepare(self, label)

    def spy_submit(self, action):
        events.append(("submitted", str(action.label)))
        return submit(self, action)

    def spy_place(self, label, result):
        events.append(("placed in " + threading.current_thread().name, str(label)))
        return place_early(self, label, result)

    monkeypatch.setattr(_outcomes.Outcomes, "prepare", spy_prepare)
    monkeypatch.setattr(_rebuild.Rebuilder, "submit", spy_submit)
    monkeypatch.setattr(_materialize.Materializer, "place_early", spy_place)
    result = ws.build("//p:*", jobs=1)
    assert result.ok and len(result.ran) == 20, result.error
    keyed = [i for i, (what, _label) in enumerate(events) if what == "keyed"]
    submitted = [i for i, (what, _label) in enumerate(events) if what == "submitted"]
    placed = [i for i, (what, _label) in enumerate(events) if what.startswith("placed")]
    assert len(placed) == len(submitted) == 20
    assert submitted[0] < keyed[1]  # started once one target was keyed
    assert all(events[i][0] != "placed in MainThread" for i in placed)
    for i in range(20):
        assert result.output(f"//p:g{i}").read_text() == f"{i}\n"
