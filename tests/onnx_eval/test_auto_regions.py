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


def test_overrides_carry_a_stable_selector():
    doc = region_overrides(Y8, {"ranking": [{"site": "stem.out", "kind": "activation"}]})
    assert doc["selectors"] == ["region:stem:stem.out"]
    assert doc["nodes_to_exclude"][0] == "stem/Conv" and doc["region"]["nodes"] == 4
    with pytest.raises(OnnxError, match="no rank 1"):
        region_overrides(Y8, {"ranking": [{"site": "stem.out", "kind": "activation"}]}, 1)


def test_union_of_several_regions():
    ranking = {"ranking": [{"site": "stem.out", "kind": "activation"},
                           {"site": "output0", "kind": "activation"}]}
    doc = region_overrides(Y8, ranking, count=2)
    nodes = [n.name for n in onnx.load(Y8).graph.node]
    assert doc["nodes_to_exclude"] == [n for n in nodes if n in set(doc["nodes_to_exclude"])]
    assert "stem/Conv" in doc["nodes_to_exclude"] and "/model.22/Concat_out" in \
        doc["nodes_to_exclude"]
    assert doc["selectors"] == ["region:stem:stem.out", "region:head:output0"]
    assert doc["region"]["where"] == "stem+head"


def test_region_with_the_next_ranked_activations_at_uint16():
    ranking = {"ranking": [{"site": s, "kind": "activation"}
                           for s in ("stem.out", "stage1.out", "head0.out", "stage2.out")]}
    doc = region_overrides(Y8, ranking, promote=2)
    # tensors produced inside the float region are skipped: they are float already
    inside = set(doc["nodes_to_exclude"])
    producers = {t: n.name for n in onnx.load(Y8).graph.node for t in n.output}
    assert list(doc["tensors"]) == [t for t in ("stage1.out", "head0.out", "stage2.out")
                                    if producers[t] not in inside][:2]
    assert all(v == {"quant_type": "uint16"} for v in doc["tensors"].values())
    assert set(doc["tensors"]) <= set(doc["promoted"])
    assert region_overrides(Y8, ranking)["tensors"] == {}
