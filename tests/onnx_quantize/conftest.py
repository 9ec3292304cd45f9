"""Shared fixtures for the quantization tests: models written once per session, with inputs
and calibration files made by running the float models in onnxruntime."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import quant_testlib as lib


@dataclass
class Case:
    """A float model file, its feeds and a calibration.json computed on it."""

    model: Path
    calibration: Path
    feeds: list[dict[str, np.ndarray]]


@pytest.fixture(scope="session")
def qdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("quant")


def _case(qdir: Path, name: str, model, feeds=None) -> Case:
    path = lib.save(model, qdir / f"{name}.onnx") if not isinstance(model, Path) else model
    feeds = feeds if feeds is not None else lib.random_inputs(path, 8)
    return Case(path, lib.write_calibration(path, feeds, qdir / f"{name}.calibration.json"), feeds)


@pytest.fixture(scope="session")
def conv_case(qdir) -> Case:
    return _case(qdir, "conv_chain", lib.conv_chain_model())


@pytest.fixture(scope="session")
def conv11_case(qdir) -> Case:
    return _case(qdir, "conv_chain_opset11", lib.conv_chain_model(opset=11))


@pytest.fixture(scope="session")
def gemm_case(qdir) -> Case:
    return _case(qdir, "gemm_matmul", lib.gemm_matmul_model())


@pytest.fixture(scope="session")
def mnist_case(qdir) -> Case:
    return _case(qdir, "mnist", lib.MNIST, lib.digit_inputs())


@pytest.fixture(scope="session")
def mobilenet_case(qdir) -> Case:
    from onnxruntime.quantization.shape_inference import quant_pre_process

    pre = qdir / "mobilenet_pre.onnx"
    quant_pre_process(str(lib.MOBILENET), str(pre))
    return _case(qdir, "mobilenet_pre", pre, lib.image_inputs())
