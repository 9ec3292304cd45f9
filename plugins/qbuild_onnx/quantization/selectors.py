"""Stable selectors: naming nodes and tensors in a way that survives graph optimizers.

Node names change when onnxruntime's pre-processing rewrites a pattern (1.32 turns YOLOX's
six Focus ``Slice`` nodes and their ``Concat`` into ``SpaceToDepth`` + ``Gather``), so
every place where users name nodes or tensors (``nodes_to_exclude``, ``nodes_to_quantize``,
``node_overrides``, ``tensor_overrides``, overrides documents) also takes selectors,
resolved on the model the rule actually receives:

=====================  ===============================================================
``Conv_41``            exactly that name (a name that exists always means itself)
``name:Conv_4*``       glob on names; a plain string holding ``*``, ``?`` or ``[`` too
``op:Sigmoid,Mul``     every node of these operator types (globs allowed)
``upto:729``           the node producing tensor 729 and everything it depends on, up to
                       the graph inputs ("from the input up to tensor X")
``after:1213``         every node that depends on tensor 1213 ("everything after Y")
``first:11``           the first 11 weighted layers (Conv, ConvTranspose, Gemm, MatMul with
                       a constant weight) and everything before them
``last:3``             the last 3 weighted layers and everything after them
``op:Conv & upto:729`` the intersection of selectors
=====================  ===============================================================

For tensors, a selector stands for the output tensors of the nodes it selects (an exact
tensor name, or ``name:GLOB`` over tensor names, means the tensor itself). A selector that
selects nothing is an error, as is a missing exact name; when pre-processing removed the
name, the error says which rewrite removed it and suggests a selector.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from typing import Any

import onnx
from qbuild_onnx_common.errors import OnnxError

PREFIXES = ("name", "op", "upto", "after", "first", "last")
WEIGHTED_OPS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})
_GLOB = frozenset("*?[")
DOCS = "docs/selectors.md"


class _Graph:
    """The main graph's nodes with producer / consumer indexes (nodes are topological)."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.nodes = list(model.graph.node)
        self.names = [n.name for n in self.nodes]
        self.initializers = {i.name for i in model.graph.initializer}
        self.producer: dict[str, int] = {}
        self.consumers: dict[str, list[int]] = {}
        for i, n in enumerate(self.nodes):
            for o in n.output:
                if o:
                    self.producer[o] = i
            for t in n.input:
                if t:
                    self.consumers.setdefault(t, []).append(i)
        self.tensors = (set(self.producer) | self.initializers
                        | {i.name for i in model.graph.input})

    def ancestors(self, starts: Iterable[int]) -> set[int]:
        seen: set[int] = set()
        stack = list(starts)
        while stack:
            i = stack.pop()
            if i in seen:
                continue
            seen.add(i)
            stack.extend(self.producer[t] for t in self.nodes[i].input if t in self.producer)
        return seen

    def descendants(self, tensors: Iterable[str]) -> set[int]:
        seen: set[int] = set()
        stack = [c for t in tensors for c in self.consumers.get(t, [])]
        while stack:
            i = stack.pop()
            if i in seen:
                continue
            seen.add(i)
            stack.extend(c for o in self.nodes[i].output for c in self.consumers.get(o, []))
        return seen

    def in_order(self, tensors: Iterable[str]) -> list[str]:
        """Tensors in graph order (inputs and initializers first, by name)."""
        return sorted(set(tensors), key=lambda t: (self.producer.get(t, -1), t))

    def is_weighted(self, i: int) -> bool:
        n = self.nodes[i]
        if n.op_type not in WEIGHTED_OPS or len(n.input) < 2:
            return False
        w = n.input[1]
        if w in self.initializers:
            return True
        p = self.producer.get(w)  # a QDQ model's weight comes through DequantizeLinear
        return p is not None and self.nodes[p].op_type == "DequantizeLinear" and \
            self.nodes[p].input[0] in self.initializers

    def weighted(self) -> list[int]:
        return [i for i in range(len(self.nodes)) if self.is_weighted(i)]


def is_selector(text: str) -> bool:
    """True if ``text`` is a selector rather than a plain name (names are checked first)."""
    head = text.split(":", 1)[0].strip()
    return (":" in text and head in PREFIXES) or " & " in text or bool(_GLOB & set(text))


def _count(text: str, where: str, attr: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise OnnxError(f"{where}: expected a positive count, got {text!r}", attr=attr)
    return n


def _select(g: _Graph, part: str, where: str, attr: str) -> set[int]:
    prefix, _, arg = part.partition(":")
    prefix, arg = prefix.strip(), arg.strip()
    if not _ or prefix not in PREFIXES:
        prefix, arg = "name", part
    if prefix == "name":
        return {i for i, nm in enumerate(g.names) if nm and fnmatch.fnmatchcase(nm, arg)}
    if prefix == "op":
        pats = [p.strip() for p in arg.split(",") if p.strip()]
        return {i for i, n in enumerate(g.nodes)
                if any(fnmatch.fnmatchcase(n.op_type, p) for p in pats)}
    if prefix in ("upto", "after"):
        if arg not in g.tensors:
            raise OnnxError(f"{where}: no tensor named {arg!r} in the model "
                                f"(see {DOCS})", attr=attr)
        if prefix == "after":
            return g.descendants([arg])
        return g.ancestors([g.producer[arg]]) if arg in g.producer else set()
    n = _count(arg, where, attr)
    weighted = g.weighted()
    if prefix == "first":
        return g.ancestors(weighted[:n])
    last = weighted[-n:] if weighted else []
    return set(last) | g.descendants(o for i in last for o in g.nodes[i].output)


def _selected(g: _Graph, selector: str, where: str, attr: str) -> set[int]:
    parts = [p.strip() for p in selector.split(" & ")]
    if not all(parts):
        raise OnnxError(f"{where}: malformed selector {selector!r} (see {DOCS})", attr=attr)
    found = _select(g, parts[0], where, attr)
    for part in parts[1:]:
        found &= _select(g, part, where, attr)
    return found


def _missing_names_error(missing: list[str], attr: str, what: str,
                         rewrites: Mapping[str, Any] | None, g: _Graph) -> OnnxError:
    quoted = ", ".join(map(repr, missing))
    removed = dict((rewrites or {}).get("removed") or {})
    gone = [m for m in missing if m in removed]
    if not gone:
        return OnnxError(f"{attr}: no {what} named {quoted} in the model; stable "
                             f"selectors (globs, 'op:TYPE', 'upto:TENSOR', 'first:N', ...) "
                             f"are described in {DOCS}", attr=attr)
    ops: dict[str, int] = {}
    for m in gone:
        ops[removed[m]["op"]] = ops.get(removed[m]["op"], 0) + 1
    by = (rewrites or {}).get("by") or "pre-processing"
    added = ", ".join((rewrites or {}).get("added_ops") or []) or "nothing new"
    # Suggest the region ending at the last surviving output of a removed node.
    surviving = [o for m in gone for o in removed[m].get("outputs", []) if o in g.producer]
    hint = [f"'upto:{max(surviving, key=lambda t: g.producer[t])}' (everything up to the "
            f"tensor they produced, still in the model)"] if surviving else []
    hint += [f"'op:{op}'" for op in sorted(ops)][:2]
    return OnnxError(
        f"{attr}: no {what} named {quoted} in the model: {by} removed "
        f"{'it' if len(gone) == 1 else 'them'} ("
        + ", ".join(f"{op} x{k}" for op, k in sorted(ops.items()))
        + f" rewritten; it added {added}); name them by a stable selector instead, e.g. "
        + " or ".join(hint) + f" ({DOCS})", attr=attr)


def resolve_nodes(selectors: Iterable[str], model: onnx.ModelProto, attr: str,
                  rewrites: Mapping[str, Any] | None = None) -> list[str]:
    """Node names selected by ``selectors`` (names and selectors), in graph order."""
    g = _Graph(model)
    known = {nm for nm in g.names if nm}
    picked: set[int] = set()
    missing: list[str] = []
    index = {nm: i for i, nm in enumerate(g.names) if nm}
    for sel in selectors:
        if sel in known:
            picked.add(index[sel])
        elif is_selector(sel):
            found = _selected(g, sel, f"{attr}: selector {sel!r}", attr)
            if not found:
                raise OnnxError(f"{attr}: selector {sel!r} selects no node in the model",
                                    attr=attr)
            unnamed = [g.nodes[i].op_type for i in found if not g.names[i]]
            if unnamed:
                raise OnnxError(f"{attr}: selector {sel!r} selects {len(unnamed)} "
                                    f"unnamed node(s) ({unnamed[0]}, ...); onnxruntime "
                                    f"can only exclude nodes by name", attr=attr)
            picked |= found
        else:
            missing.append(sel)
    if missing:
        raise _missing_names_error(sorted(missing), attr, "node", rewrites, g)
    return [g.names[i] for i in sorted(picked)]


def resolve_node_table(table: Mapping[str, Any], model: onnx.ModelProto, attr: str,
                       rewrites: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``table`` (node name or selector -> value) keyed by the node names it selects."""
    out: dict[str, Any] = {}
    source: dict[str, str] = {}
    for key in sorted(table, key=lambda k: (is_selector(k), k)):
        for name in resolve_nodes([key], model, attr, rewrites):
            if name in out and out[name] != table[key] and is_selector(source[name]):
                raise OnnxError(f"{attr}: node {name!r} is selected by {source[name]!r} "
                                    f"and {key!r} with different settings", attr=attr)
            if name not in out or is_selector(source[name]):
                out[name], source[name] = table[key], key
    return out


def resolve_tensors(table: Mapping[str, Any], model: onnx.ModelProto, attr: str,
                    rewrites: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``table`` (tensor name or selector -> value) with selectors expanded to tensor names.

    Exact names win over selectors; two selectors giving one tensor different values is an
    error naming both.
    """
    g = _Graph(model)
    out: dict[str, Any] = {}
    source: dict[str, str] = {}
    missing: list[str] = []
    for key in sorted(table, key=lambda k: (is_selector(k) and k not in g.tensors, k)):
        value = table[key]
        if key in g.tensors:
            out[key], source[key] = value, key
            continue
        if not is_selector(key):
            missing.append(key)
            continue
        where = f"{attr}: selector {key!r}"
        prefix = key.split(":", 1)[0].strip() if ":" in key else "name"
        if prefix == "name" and " & " not in key:
            pat = key.split(":", 1)[1].strip() if key.startswith("name:") else key
            names = g.in_order(t for t in g.tensors if fnmatch.fnmatchcase(t, pat))
        else:
            nodes = _selected(g, key, where, attr)
            names = g.in_order({o for i in nodes for o in g.nodes[i].output if o})
        if not names:
            raise OnnxError(f"{where} selects no tensor in the model", attr=attr)
        for t in names:
            if t in source and source[t] in g.tensors:
                continue  # an exact name wins
            if t in out and out[t] != value:
                raise OnnxError(f"{attr}: tensor {t!r} is selected by {source[t]!r} and "
                                    f"{key!r} with different settings", attr=attr)
            out[t], source[t] = value, key
    if missing:
        raise _missing_names_error(sorted(missing), attr, "tensor", rewrites, g)
    return out


def rewrites_between(before: onnx.ModelProto, after: onnx.ModelProto, by: str
                     ) -> dict[str, Any]:
    """What a graph rewrite did to node names: the record quantize's errors explain with."""
    after_names = {n.name for n in after.graph.node if n.name}
    removed = {n.name: {"op": n.op_type, "outputs": [o for o in n.output if o]}
               for n in before.graph.node if n.name and n.name not in after_names}
    added = sorted({n.op_type for n in after.graph.node}
                   - {n.op_type for n in before.graph.node})
    return {"by": by, "removed": dict(sorted(removed.items())), "added_ops": added}


def resolve_tensor_list(entries: Iterable[str], model: onnx.ModelProto, attr: str) -> list[str]:
    """Tensor names selected by ``entries`` (names and selectors), first-seen order."""
    out: list[str] = []
    for entry in entries:
        for name in resolve_tensors({entry: True}, model, attr):
            if name not in out:
                out.append(name)
    return out
