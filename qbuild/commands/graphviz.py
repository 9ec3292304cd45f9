"""Rendering the target graph as Graphviz dot or Mermaid text."""

from __future__ import annotations

from ..analysis.graph import Graph
from ..core.labels import Label


def render(graph: Graph, labels: list[Label], fmt: str) -> str:
    nodes = sorted(labels)
    edges = sorted((x, dep) for x in nodes for dep in graph.targets[x].deps if dep in labels)
    if fmt == "dot":
        lines = ["digraph qbuild {", "  rankdir=LR;", "  node [shape=box, fontname=monospace];"]
        for x in nodes:
            lines.append(f'  "{x}" [label="{x}\\n({graph.targets[x].kind})"];')
        for x, dep in edges:
            lines.append(f'  "{x}" -> "{dep}";')
        lines.append("}")
        return "\n".join(lines) + "\n"
    ids = {x: f"n{i}" for i, x in enumerate(nodes)}
    lines = ["graph LR"]
    for x in nodes:
        text = f"{x} ({graph.targets[x].kind})".replace('"', "'")
        lines.append(f'  {ids[x]}["{text}"]')
    for x, dep in edges:
        lines.append(f"  {ids[x]} --> {ids[dep]}")
    return "\n".join(lines) + "\n"
