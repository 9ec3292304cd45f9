"""How ``qbuild query`` prints targets: JSON records and BUILD.toml tables (``--output
build``), both with every attribute after defaults and matrix expansion."""

from __future__ import annotations

import json
import re
from typing import Any

from ..analysis.graph import Graph, Target
from ..core.labels import Label

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def as_records(graph: Graph, labels: list[Label]) -> list[dict[str, Any]]:
    """One JSON-ready record per target."""
    records = []
    for label in labels:
        target = graph.targets[label]
        records.append({"label": str(label), "kind": target.kind,
                        "deps": [str(d) for d in target.deps],
                        "build_file": target.build_file, "tags": list(target.tags),
                        "attrs": _shown_attrs(target), "not_applicable": list(target.inactive),
                        "outputs": list(target.outputs)})
    return records


def as_build(graph: Graph, labels: list[Label]) -> str:
    """The targets as BUILD.toml tables (matrix variants as their own tables)."""
    chunks = []
    # a matrix group named on its own stands for its variants: print them too
    wanted = set(labels)
    shown: list[Label] = []
    for label in labels:
        shown.append(label)
        if graph.targets[label].is_group:
            shown += [d for d in graph.targets[label].deps if d not in wanted]
    for label in dict.fromkeys(shown):
        target = graph.targets[label]
        lines = [f"# {target.build_file}"]
        if target.is_group:
            lines.append(f"# {label}: matrix of {len(target.deps)} variants: "
                         + ", ".join(str(d) for d in target.deps))
            chunks.append("\n".join(lines) + "\n")
            continue
        lines.append(f"[{_key(label.name)}]")
        lines.append(f"rule = {_value(target.kind)}")
        for name, value in _shown_attrs(target).items():
            lines.append(f"{_key(name)} = {_value(value)}")
        if target.tags:
            lines.append(f"tags = {_value(list(target.tags))}")
        if target.inactive:
            lines.append(f"# not applicable here (kept at default): {', '.join(target.inactive)}")
        chunks.append("\n".join(lines) + "\n")
    return "\n".join(chunks)


def _shown_attrs(target: Target) -> dict[str, Any]:
    """Attributes as a user would write them in the target's package: labels canonical,
    source files relative to the package; unset optional ones and inapplicable ones left out."""
    assert target.rule is not None or target.is_group
    shown: dict[str, Any] = {}
    if target.rule is None:
        return shown
    prefix = f"{target.label.package}/" if target.label.package else ""
    for name, value in target.attrs.items():
        if value is None or name in target.inactive:
            continue
        if target.rule.attrs[name].type in ("file", "files"):
            value = _package_relative(value, prefix)
        shown[name] = value
    return shown


def _package_relative(value: Any, prefix: str) -> Any:
    if isinstance(value, list):
        return [_package_relative(v, prefix) for v in value]
    if isinstance(value, str) and not value.startswith("//") and value.startswith(prefix):
        return value[len(prefix):]
    return value


def _key(name: str) -> str:
    return name if _BARE_KEY.match(name) else json.dumps(name)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        items = ", ".join(f"{_key(str(k))} = {_value(v)}" for k, v in value.items()
                          if v is not None)
        return "{ " + items + " }" if items else "{}"
    return json.dumps(str(value), ensure_ascii=False)
