"""Reading and editing ModelProto basics: node attributes, opset imports, the IR version a
model's opsets need, the graph inputs that are real inputs (not initializers), who reads
each tensor, and ``GraphIndex`` (one graph's producers, readers, initializers, outputs and
free names). onnx is imported inside the functions, so importing this is free."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from onnx import GraphProto, ModelProto, NodeProto, TensorProto, ValueInfoProto

_DEFAULT_DOMAINS = ("", "ai.onnx")


def attr(node: NodeProto, name: str, default: Any = None) -> Any:
    """The value of a node attribute (ints, floats, strings, tensors, graphs), or default."""
    from onnx.helper import get_attribute_value

    for a in node.attribute:
        if a.name == name:
            return get_attribute_value(a)
    return default


def attrs(node: NodeProto, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """Every attribute of a node by name (for rebuilding it with ``make_node``)."""
    from onnx.helper import get_attribute_value

    return {a.name: get_attribute_value(a) for a in node.attribute if a.name not in skip}


def _domains(domain: str) -> tuple[str, ...]:
    return (domain,) if domain not in _DEFAULT_DOMAINS else _DEFAULT_DOMAINS


def opset(model: ModelProto, domain: str = "", default: int | None = None) -> int | None:
    """The model's opset of ``domain`` ("" and "ai.onnx" are the default domain), or
    ``default`` when it does not import it."""
    for o in model.opset_import:
        if o.domain in _domains(domain):
            return int(o.version)
    return default


def set_opset(model: ModelProto, version: int, domain: str = "") -> None:
    """Import ``domain`` at ``version`` (replacing the model's import of it, if any)."""
    for o in model.opset_import:
        if o.domain in _domains(domain):
            o.version = version
            return
    from onnx.helper import make_opsetid

    model.opset_import.append(make_opsetid(domain, version))


def min_ir_version(model: ModelProto) -> int:
    """The lowest IR version the model's opset imports allow (and at least 4, the first IR
    that lets initializers not be graph inputs)."""
    from onnx.helper import find_min_ir_version_for

    return max(4, find_min_ir_version_for(list(model.opset_import), True))


def bump_ir_version(model: ModelProto) -> None:
    """Raise the model's IR version to what its opset imports need (never lower it)."""
    need = min_ir_version(model)
    if model.ir_version < need:
        model.ir_version = need


def real_inputs(model: ModelProto) -> list[ValueInfoProto]:
    """Graph inputs that are real inputs (not initializers listed as inputs, IR < 4)."""
    inits = {i.name for i in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def consumers(graph: GraphProto) -> dict[str, list[NodeProto]]:
    """The nodes reading each tensor of a graph (its own nodes, not subgraphs'), in order."""
    readers: dict[str, list[NodeProto]] = {}
    for n in graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    return readers


class GraphIndex:
    """Who produces and who reads each tensor of one graph (its own nodes, not
    subgraphs'; empty names, ONNX's "input or output left out", are not tensors), its
    initializers by name and its output names: a snapshot taken when built, except
    ``unique_name``, which reads the graph as it is now."""

    def __init__(self, graph: GraphProto) -> None:
        self.graph = graph
        self.producers: dict[str, NodeProto] = {}
        self.consumers: dict[str, list[NodeProto]] = {}
        for node in graph.node:
            for name in node.input:
                if name:
                    self.consumers.setdefault(name, []).append(node)
            for name in node.output:
                if name:
                    self.producers[name] = node
        self.initializers: dict[str, TensorProto] = {t.name: t for t in graph.initializer}
        self.outputs: set[str] = {o.name for o in graph.output}

    def use_count(self, name: str) -> int:
        """How many node inputs read ``name`` (a weight read twice by one node counts 2,
        as that node is listed twice among its consumers)."""
        return len(self.consumers.get(name, ()))

    def unique_name(self, base: str) -> str:
        """``base``, or ``base_1``, ``base_2``... : the first that names no initializer,
        node output or graph input of the graph as it is now (names added since the
        index was built count)."""
        g = self.graph
        taken = {i.name for i in g.initializer} | {o for n in g.node for o in n.output}
        taken |= {i.name for i in g.input}
        name, k = base, 1
        while name in taken:
            name, k = f"{base}_{k}", k + 1
        return name
