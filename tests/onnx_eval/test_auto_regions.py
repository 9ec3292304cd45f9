"""Whole-region exclusion: the stem or the head around the most sensitive activation."""

from __future__ import annotations

import onnx
import pytest
from eval_paths import MODELS
from qbuild_onnx.auto.regions import region_for, region_overrides
from qbuild_onnx_common.errors import OnnxError

Y8 = MODELS / "yolov8_tiny.onnx"


def test_head_region_runs_from_the_producer_to_the_end():
    nodes = [n.name for n in onnx.load(Y8).graph.node]
    where, region = region_for(Y8, "output0")
    assert where == "head" and region == nodes[nodes.index("/model.22/Concat_out"):]


def test_stem_region_runs_from_the_start_to_the_consumers():
    nodes = [n.name for n in onnx.load(Y8).graph.node]
    where, region = region_for(Y8, "stem.out")
    assert where == "stem" and region == nodes[: nodes.index("stage1/Conv") + 1]


def test_overrides_are_stable_selectors_never_node_names():
    doc = region_overrides(Y8, {"ranking": [{"site": "stem.out", "kind": "activation"}]})
    # the stem: everything the consumer of stem.out depends on, named by its output tensor
    assert doc["nodes_to_exclude"] == doc["selectors"] == ["upto:stage1.y"]
    names = {n.name for n in onnx.load(Y8).graph.node}
    assert not names & set(doc["nodes_to_exclude"])
    assert doc["promoted"][0] == "stem/Conv" and doc["region"]["nodes"] == 4
    # quantize resolves them to the same region on the model it receives
    from qbuild_onnx.quantization.selectors import resolve_nodes
    assert resolve_nodes(doc["nodes_to_exclude"], onnx.load(Y8), "x") == \
        region_for(Y8, "stem.out")[1]
    with pytest.raises(OnnxError, match="no rank 1"):
        region_overrides(Y8, {"ranking": [{"site": "stem.out", "kind": "activation"}]}, 1)


def test_union_of_several_regions():
    ranking = {"ranking": [{"site": "stem.out", "kind": "activation"},
                           {"site": "output0", "kind": "activation"}]}
    doc = region_overrides(Y8, ranking, count=2)
    nodes = [n.name for n in onnx.load(Y8).graph.node]
    assert doc["promoted"] == [n for n in nodes if n in set(doc["promoted"])]
    assert "stem/Conv" in doc["promoted"] and "/model.22/Concat_out" in doc["promoted"]
    assert doc["selectors"][0] == "upto:stage1.y"
    assert doc["selectors"][1].startswith("upto:output0 & after:")  # the head's producer
    assert doc["region"]["where"] == "stem+head"


def test_region_with_the_next_ranked_activations_at_uint16():
    ranking = {"ranking": [{"site": s, "kind": "activation"}
                           for s in ("stem.out", "stage1.out", "head0.out", "stage2.out")]}
    doc = region_overrides(Y8, ranking, promote=2)
    # tensors produced inside the float region are skipped: they are float already
    inside = set(doc["promoted"])
    producers = {t: n.name for n in onnx.load(Y8).graph.node for t in n.output}
    assert list(doc["tensors"]) == [t for t in ("stage1.out", "head0.out", "stage2.out")
                                    if producers[t] not in inside][:2]
    assert all(v == {"quant_type": "uint16"} for v in doc["tensors"].values())
    assert set(doc["tensors"]) <= set(doc["promoted"])
    assert region_overrides(Y8, ranking)["tensors"] == {}


def test_the_region_is_the_smaller_side_whatever_the_node_order(tmp_path):
    """Optimizers reorder nodes: with the class branches first, the score Concat (two
    nodes before the output) sits in the first half of the node list. Its stem would be
    the whole model (nothing left to quantize); the head is the two Concats."""
    m = onnx.load(Y8)
    late = ("box", "Box", "_xy", "_wh", "grid", "stride", "Concat_out", "Split")
    nodes = list(m.graph.node)
    order = [n for n in nodes if not any(k in n.name for k in late)] + \
        [n for n in nodes if any(k in n.name for k in late)]
    del m.graph.node[:]
    m.graph.node.extend(order)
    onnx.checker.check_model(m)
    producer = next(i for i, n in enumerate(m.graph.node) if "scores" in n.output)
    assert producer < len(order) / 2
    path = tmp_path / "reordered.onnx"
    onnx.save(m, path)
    where, region = region_for(path, "scores")
    assert where == "head" and region == ["/model.22/Concat_scores", "/model.22/Concat_out"]
    assert region_for(path, "stem.out") == region_for(Y8, "stem.out")  # still the stem
