"""The key of one declared action of a v2 target.

Each declared action is keyed from its own parts only: the target's shared parts
(``TargetActions.action_base``), the action's mnemonic, function and code digest, its params,
output names and layout, and the content of its inputs (a dependency's outputs, a
source file's digest by its path in the package, an earlier action's outputs), never
the target's label. ``declared_action_parts`` gives those parts and
``declared_action_key`` hashes them; running the actions is ``execution.actions``'s.
"""

from __future__ import annotations

from typing import Any

from ..api.actions import ActionSpec
from ..core.keyhash import key_hash
from ..core.records import OutputEntry, TargetActions
from .parts import dep_part

Made = dict[str, list[OutputEntry]]
"""Outputs of a target's earlier actions, by output name."""


def package_path(action: TargetActions, rel: str) -> str:
    """The workspace path ``rel`` of a source of ``action``'s target, relative to its
    package (how keys and sandboxes name it: a package moved keeps its keys)."""
    package = action.label.package
    return rel[len(package) + 1:] if package else rel


def _item_part(action: TargetActions, item: str) -> dict[str, Any]:
    if item.startswith("//"):
        return {"dep": dep_part(action.deps[item])}
    return {"src": package_path(action, item), "digest": action.sources[item][0],
            "x": item in action.executable}


def _input_part(action: TargetActions, name: str, made: Made) -> Any:
    kind = action.attr_types.get(name)
    if kind is None:
        entries = made[name]
        return {"made": {e.path: e.digest for e in entries},
                "executable": sorted(e.path for e in entries if e.executable)}
    value = action.attrs[name]
    if value is None:
        return None
    if kind == "label":
        return dep_part(action.deps[value])
    if kind == "label_list":
        return [dep_part(action.deps[v]) for v in value]
    if kind == "file":
        return _item_part(action, value)
    return [_item_part(action, item) for item in value]


def declared_action_parts(action: TargetActions, index: int, made: Made) -> dict[str, Any]:
    """The key parts of declared action ``index`` (``made``: outputs of earlier ones)."""
    spec: ActionSpec = action.actions[index]
    parts = {**action.action_base, "action": spec.mnemonic, "function": spec.function,
             "code": action.action_code[index], "params": spec.params,
             "outputs": list(spec.outputs),
             "inputs": {name: _input_part(action, name, made) for name in spec.inputs}}
    if spec.layout:  # only actions declaring one have the part (other keys stay)
        parts["layout"] = spec.layout
    return parts


declared_action_key = key_hash
"""The key of a declared action from its key parts: ``core.keyhash.key_hash``, the one
hash every key (and the store's gate, checking one) uses."""
