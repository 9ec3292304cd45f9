"""The gate every action-cache entry passes (``qbuild.store.gate``): keys recomputed
exactly as the keyer computes them, paths kept inside the output folder, sizes whole and
bounded, executable bits kept, and anything else refused with a one-line reason."""

from __future__ import annotations

import json

import pytest

from qbuild.core.keyhash import key_hash
from qbuild.keys.action_keys import declared_action_key
from qbuild.keys.parts import target_key
from qbuild.store import gate
from qbuild.store.local import LocalStore

DIGEST = "ab" * 32


def record(*paths: str, declared: list[str] | None = None, **extra):
    outputs = [{"path": p, "digest": DIGEST, "size": 3} for p in paths]
    return {"outputs": outputs, "declared": list(paths) if declared is None else declared,
            "info": {}, "warnings": [], **extra}


def test_the_gate_hashes_key_parts_as_the_keyer_does():
    # one function, so the gate cannot drift from the keyer: not two that agree today
    assert gate.key_of is target_key is declared_action_key is key_hash
    parts = {"label": "//p:é", "attrs": {"scale": 1.0, "n": 10, "big": 1e16,
                                          "list": [1, "two", None, True]},
             "code": {"unit": DIGEST}, "env": {"PATH": "/bin"}}
    assert gate.key_of(parts) == target_key(parts) == declared_action_key(parts)
    # ... after the round trip through the metadata blob's JSON too
    again = json.loads(json.dumps(parts, sort_keys=True))
    assert gate.key_of(again) == target_key(parts)


def test_an_entry_is_bound_to_its_key():
    target = {"label": "//p:two", "code": {}, "attrs": {}}
    step = {"action": "concat", "params": {"upper": True}}
    assert gate.bound_parts(target, target_key(target)) is target
    both = {**target, "key_parts": step}
    assert gate.bound_parts(both, declared_action_key(step)) is step
    for parts in (target, both, None, "text", {"key_parts": "x"}):
        with pytest.raises(gate.Refused):
            gate.bound_parts(parts, "0" * 64)
    result, _ = gate.admit(record("out.txt"), target_key(target), target)
    assert [e.path for e in result.outputs] == ["out.txt"]
    with pytest.raises(gate.Refused, match="another action"):
        gate.admit(record("out.txt"), "0" * 64, target)


# (A backslash is an ordinary character of a name here, as on the filesystem: "a\\b"
# names one file inside the folder, so the local and the remote gate both let it pass.)
@pytest.mark.parametrize("path", ["", ".", "..", "../x", "a/../b", "/abs", "a//b", "a/",
                                  "./a", "a/.", "nul\0", "x" * 256, "\ud800"])
def test_paths_outside_or_unnormalized_are_refused(path):
    assert not gate.safe_path(path)
    with pytest.raises(gate.Refused):
        gate.check_result(record(path))


def test_names_judged_once_per_process_are_judged_the_same_again():
    """Accepted names are remembered (``_SAFE``), refused ones never: a declared folder
    "d/" accepted does not make "d/" an output's path, and a bad name is refused on
    every entry naming it, however often a good one was seen beside it."""
    for _ in range(2):
        assert gate.check_result(record("d/a", declared=["d/"])).outputs
        assert gate.unsafe_name(gate.check_result(record("d/a", declared=["d/"]))) is None
        for bad in (record("d/", declared=["d/"]), record("../d/a", declared=["d/"]),
                    record("d/a", declared=["d//"]), record("ok", declared=["ok", ".."])):
            with pytest.raises(gate.Refused):
                gate.check_result(bad)
    placed = gate.check_result(record("x/y"))
    object.__setattr__(placed, "declared", ("..",))  # whoever hands it on after the gate
    assert gate.unsafe_name(placed) == ".."


def test_files_inside_files_and_undeclared_or_missing_outputs_are_refused():
    assert gate.check_result(record("d/a", "d/b", declared=["d/"])).outputs
    for bad in (record("a", "a/b", declared=["a", "a/"]), record("a", declared=["b"]),
                record("a", declared=["a", "b"]), record("a", "a")):
        with pytest.raises(gate.Refused):
            gate.check_result(bad)


@pytest.mark.parametrize("size", [1e999, 1.5, -1, True, "1e3", "-1", " 1", "9" * 30,
                                  1 << 63, None, "٣"])
def test_sizes_are_whole_and_bounded(size):
    with pytest.raises(gate.Refused):
        gate.size_of(size)


def test_sizes_as_proto3_json_writes_them():
    assert gate.size_of("3544921") == gate.size_of(3544921) == 3544921
    assert gate.size_of(str(gate.MAX_BLOB_BYTES)) == gate.MAX_BLOB_BYTES


def test_the_executable_bit_is_kept_and_must_be_a_bool():
    entry = record("run.sh")
    entry["outputs"][0]["x"] = True
    (output,) = gate.check_result(entry, origin="remote").outputs
    assert output.executable
    entry["outputs"][0]["x"] = "yes"
    with pytest.raises(gate.Refused):
        gate.check_result(entry)


def test_deep_or_garbage_json_is_refused_not_raised():
    deep: object = 0
    for _ in range(gate.MAX_DEPTH + 1):
        deep = [deep]
    for raw in (b"[" * 100_000, b'{"a": 1', b"\xff", json.dumps(deep).encode()):
        with pytest.raises(gate.Refused):
            gate.load_json(raw, 1 << 20)
    with pytest.raises(gate.Refused):
        gate.load_json(b"[]" * 100, 10)
    with pytest.raises(gate.Refused):
        gate.check_result(record("a", info={"x": deep}))


@pytest.mark.parametrize("parts", [
    {"sources": "x"}, {"code": {"u": 1}}, {"deps": {"//x:y": "z"}},
    {"deps": {"//x:y": {"outputs": {}}}}, {"deps": {"//x:y": {"outputs": [], "info": {}}}},
    {"attrs": []}, {"env": {"A": None}}, {"key_parts": {"sources": 1}}, [],
])
def test_key_parts_explain_could_not_read_are_refused(parts):
    with pytest.raises(gate.Refused):
        gate.check_parts(parts)


def test_what_the_keyer_records_is_admitted(ws):
    """Every entry a build writes, with the key parts recorded for it, passes the gate
    (so a store may check every entry it reads)."""
    ws.write("p/a.txt", "alpha\n")
    ws.write("p/BUILD.toml", '[one]\nrule = "concat"\nsrcs = ["a.txt"]\n\n'
             '[two]\nrule = "concat"\ndeps = [":one"]\nupper = true\n')
    assert ws.build("//p:two").ok
    # (Both are keyed by their one action: their target parts hold ``key_parts``.)
    keys = [record["key"] for record in ws.aquery("//p:one", "//p:two")]
    store = LocalStore(ws.cache_dir)
    try:
        for key in keys:
            result = store.get_action(key)
            assert result is not None
            gate.admit(result.to_json(), key, store.get_components(key))
    finally:
        store.close()


def test_every_key_a_build_makes_is_the_gates_hash_of_its_stored_parts(ws):
    """The keys the keyer made in a real build (a target keyed by its parts, one keyed
    by its one action, a declared action of a two-action target) are what the gate
    recomputes from the parts stored with them."""
    ws.write("p/a.txt", "alpha\n")
    ws.write("p/BUILD.toml", '[one]\nrule = "concat"\nsrcs = ["a.txt"]\n\n'
             '[two]\nrule = "concat"\ndeps = [":one"]\nupper = true\n')
    assert ws.build("//p:two").ok
    keys = [record["key"] for record in ws.aquery("//p:one", "//p:two")]
    store = LocalStore(ws.cache_dir)
    try:
        for key in keys:
            parts = store.get_components(key)
            assert parts is not None
            bound = parts.get("key_parts", parts)
            assert gate.key_of(bound) == key_hash(bound) == key
            assert gate.bound_parts(parts, key) is bound
    finally:
        store.close()
