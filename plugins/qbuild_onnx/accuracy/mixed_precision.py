"""Mixed precision: which tensors get 16-bit activations or stay float, chosen by name, by
operator type, or automatically from a sensitivity ranking until a target is met.

The result is always a precision-override document (see accuracy_ortq), so every trial and
the final choice are plain JSON that the ``quantize`` rule takes through its ``overrides``
label (merged into ``tensor_overrides`` / ``nodes_to_exclude``). In a build, automatic
selection is a matrix of mixed_precision -> quantize -> evaluate targets plus
``select_best`` (each trial cached); ``search`` is the same loop for Python callers.
``action`` is a quant type name ("uint16", "int16") or "float"; a tensor is kept float by
excluding its producer and every consumer from quantization.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from qbuild_onnx_common.errors import OnnxError
from qbuild_onnx_common.models import ModelSource

from .ortq import QUANT_TYPE_NAMES, merge_overrides
from .stats import load_model


def overrides_for_tensors(model: ModelSource, tensors: Sequence[str], action: str = "uint16"
                          ) -> dict[str, Any]:
    """An override document putting ``tensors`` (activation names) at ``action`` precision."""
    m = load_model(model)
    produced = {o: n.name for n in m.graph.node for o in n.output}
    consumers: dict[str, list[str]] = {}
    for n in m.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n.name)
    graph_inputs = {i.name for i in m.graph.input}
    for t in tensors:
        if t not in produced and t not in graph_inputs:
            raise OnnxError(f"no tensor named '{t}' in the model")
    if action == "float":
        nodes = set()
        for t in tensors:
            if t in produced:
                nodes.add(produced[t])
            nodes.update(consumers.get(t, []))
        return merge_overrides({"nodes_to_exclude": sorted(nodes)})
    if action not in QUANT_TYPE_NAMES:
        raise OnnxError(f"mixed-precision action must be 'float' or one of "
                            f"{', '.join(QUANT_TYPE_NAMES)}, got '{action}'")
    return merge_overrides({"tensors": {t: {"quant_type": action} for t in tensors}})


def tensors_by_op_type(model: ModelSource, op_types: Sequence[str]) -> list[str]:
    """Output tensors of every node of the given operator types (graph order)."""
    m = load_model(model)
    wanted = set(op_types)
    return [o for n in m.graph.node if n.op_type in wanted for o in n.output if o]


def ranked_tensors(sensitivity_report: Mapping[str, Any], kind: str = "activation") -> list[str]:
    """Site names of a sensitivity report's ranking (most sensitive first), of one kind."""
    if "ranking" not in sensitivity_report:
        raise OnnxError("not a sensitivity report: no 'ranking' list")
    return [r["site"] for r in sensitivity_report["ranking"] if r["kind"] == kind]


def search(
    model: ModelSource,
    ranking: Sequence[str],
    trial: Callable[[dict[str, Any]], float],
    target: float,
    action: str = "uint16",
    steps: Sequence[int] = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32),
    base: Mapping[str, Any] | None = None,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Adds the top-k ranked tensors at ``action`` for k in ``steps`` until ``trial(overrides)``
    (higher is better, e.g. output SQNR or detection F1 of the quantized model) reaches
    ``target``. Returns {"overrides", "k", "score", "met", "trials"}; when the target is never
    met the best trial is returned with met = false."""
    trials = []
    best = None
    for k in [0, *steps]:
        if k > len(ranking):
            break
        doc = merge_overrides(base or {}, overrides_for_tensors(model, ranking[:k], action))
        score = float(trial(doc))
        trials.append({"k": k, "score": round(score, 6), "tensors": list(ranking[:k])})
        if log:
            log(f"mixed precision: top {k} at {action}: score {score:.4f}")
        if best is None or score > best[1]:
            best = (k, score, doc)
        if score >= target:
            return {"overrides": doc, "k": k, "score": score, "met": True, "trials": trials}
    assert best is not None  # k = 0 always runs
    return {"overrides": best[2], "k": best[0], "score": best[1], "met": False, "trials": trials}
