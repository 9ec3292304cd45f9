"""``qbuild aquery``: the actions of targets with their inputs, outputs, params and keys
(like Bazel's aquery). Nothing runs: keys are computed from what the cache already
holds, so an action whose inputs are not built yet is listed without a key.
"""

from __future__ import annotations

import json
from typing import Any

from ..analysis.graph import Target
from ..core.errors import QbuildError
from ..core.labels import Label, output_folder


def _inputs(target: Target, names: list[str]) -> list[dict[str, Any]]:
    assert target.rule is not None
    out: list[dict[str, Any]] = []
    for name in names:
        schema = target.rule.attrs.get(name)
        if schema is None:
            out.append({"name": name, "output": f"{output_folder(target.label)}/{name}"})
            continue
        value = target.attrs.get(name)
        items = [] if value is None else value if isinstance(value, list) else [value]
        out.append({"name": name,
                    "labels": [v for v in items if v.startswith("//")],
                    "sources": [v for v in items if not v.startswith("//")]})
    return out


def actions(session: Any, roots: list[Label]) -> list[dict[str, Any]]:
    """Records of the actions of ``roots`` (keys over their dependency closure)."""
    from ..execution.actions import plan_actions

    graph = session.graph
    order = graph.analyze(roots)
    results: dict[Label, dict[str, Any]] = {}
    built: dict[Label, Any] = {}
    for label in order:
        target = graph.targets[label]
        if target.is_group or any(dep not in results for dep in target.deps
                                  if not graph.targets[dep].is_group):
            continue
        try:
            _parts, key, action = session.keyer.key_for(target, results)
        except (OSError, QbuildError, ValueError):
            continue
        built[label] = (key, action)
        cached = session.store.get_action(key)
        if cached is not None:
            results[label] = cached
    records: list[dict[str, Any]] = []
    from ..build.run import _expand_groups

    for label in _expand_groups(graph, roots):  # a matrix group: its variants
        target = graph.targets[label]
        assert target.rule is not None and target.entry is not None
        key, action = built.get(label, (None, None))
        base = {"target": str(label), "rule": target.kind, "target_key": key,
                "target_cached": label in results}
        folder = output_folder(label)
        planned = plan_actions(session.store, action) if action is not None else [
            {"spec": spec, "key": None, "cached": False} for spec in target.actions]
        for step in planned:
            spec = step["spec"]
            records.append({**base, "mnemonic": spec.mnemonic,
                            "function": spec.function, "heavy": spec.heavy,
                            "inputs": _inputs(target, list(spec.inputs)),
                            "outputs": [f"{folder}/{o}" for o in spec.outputs],
                            "params": spec.params, "key": step["key"],
                            "cached": step["cached"]})
    return records


def as_text(records: list[dict[str, Any]]) -> str:
    lines: list[str] = []
    for rec in records:
        lines.append(f"action '{rec['mnemonic']}' of {rec['target']} ({rec['function']})")
        for item in rec["inputs"]:
            if "output" in item:
                lines.append(f"  input {item['name']}: {item['output']} (earlier action)")
            else:
                shown = ", ".join(item["labels"] + item["sources"]) or "(none)"
                lines.append(f"  input {item['name']}: {shown}")
        lines.append(f"  outputs: {', '.join(rec['outputs']) or '(none: a check)'}")
        if rec["params"]:
            lines.append(f"  params: {json.dumps(rec['params'], sort_keys=True)}")
        if rec["key"] is None:
            lines.append("  key: unknown (its inputs are not built yet)")
        else:
            lines.append(f"  key: {rec['key']} ({'cached' if rec['cached'] else 'not cached'})")
    return "\n".join(lines) + ("\n" if lines else "")
