"""Calibration: run a model over a dataset and write range statistics with provenance.

Owns the public calibration API and the artifact format (documented in
docs/onnx-source-rules.md):

* ``calibration.json``: ``{"format": "qbuild-calibration", "version": 1, "method",
  "options", "symmetric", "model_sha256", "dataset_sha256", "num_samples", "libraries",
  "tensors": {name: {"min", "max", "range": [lo, hi], ...}}}``; ``range`` is what the
  method chose and what quantizers use.
* ``histograms.npz`` (histogram methods): ``names`` (T,), ``counts`` (T, bins) int64,
  ``edges`` (T, bins + 1) float32, ``kind`` ("value" or "abs"); row i is tensor names[i].

Memory stays at one batch plus the histograms: statistics are streamed (``collect``),
ranges chosen from them (``methods``). onnxruntime's calibrators are not used.

Methods: ``minmax`` (the global min and max, or their moving average over batches),
``mean_minmax`` (the mean over samples of each sample's own min and max, as NNCF's
MEAN_MINMAX range estimator: a rare outlier moves the range by 1/N of its excess, not all
of it; it runs one sample at a time, unless the model takes a fixed batch, when the mean
is over those batches), and the histogram methods ``entropy``, ``percentile`` and
``distribution`` (``methods``).
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qbuild_onnx_common.allocation import check_model
from qbuild_onnx_common.errors import OnnxError
from qbuild_onnx_common.files import sha256_file
from qbuild_onnx_common.models import load_model

if TYPE_CHECKING:
    from .collect import HistogramPass

FORMAT = "qbuild-calibration"
VERSION = 1
METHODS = ("minmax", "mean_minmax", "entropy", "percentile", "distribution")
HISTOGRAM_METHODS = ("entropy", "percentile", "distribution")
CALIBRATION_JSON = "calibration.json"
HISTOGRAMS_NPZ = "histograms.npz"


@dataclass(frozen=True)
class CalibrationOptions:
    """How to calibrate. Only the options relevant to ``method`` are recorded."""

    method: str = "minmax"
    symmetric: bool = False
    moving_average: bool = False      # minmax: EMA of per-batch min/max
    averaging_constant: float = 0.01  # minmax: EMA smoothing factor
    num_bins: int = 2048              # histogram methods
    num_quantized_bins: int = 128     # entropy
    percentile: float = 99.999        # percentile
    scenario: str = "same"            # distribution: "same" or "p3"
    op_types: tuple[str, ...] = ()    # calibrate only tensors of these node types (all if empty)
    batch_size: int | None = None     # samples per run (default: the dataset's)
    threads: int = 1                  # ORT intra-op threads

    def check(self) -> None:
        def bad(attr: str, msg: str) -> OnnxError:
            return OnnxError(msg, attr=attr)

        if self.method not in METHODS:
            raise bad("method", f"unknown method '{self.method}' ({', '.join(METHODS)})")
        if not 0.0 <= self.averaging_constant <= 1.0:
            raise bad("averaging_constant", "must be in [0, 1]")
        if self.method in HISTOGRAM_METHODS and self.num_bins < 2:
            raise bad("num_bins", "must be >= 2")
        if self.method == "entropy" and not 1 <= self.num_quantized_bins <= self.num_bins:
            raise bad("num_quantized_bins", f"must be in [1, num_bins={self.num_bins}]")
        if self.method == "percentile" and not 0.0 <= self.percentile <= 100.0:
            raise bad("percentile", "must be in [0, 100]")
        if self.method == "distribution" and self.scenario not in ("same", "p3"):
            raise bad("scenario", "must be 'same' or 'p3'")
        if self.batch_size is not None and self.batch_size < 1:
            raise bad("batch_size", "must be >= 1")
        if self.method == "mean_minmax" and self.batch_size not in (None, 1):
            raise bad("batch_size", "mean_minmax averages each sample's own min and max, so "
                                    "it runs one sample at a time: leave batch_size unset")

    def method_options(self) -> dict[str, Any]:
        opts: dict[str, Any] = {}
        if self.method == "minmax":
            opts["moving_average"] = self.moving_average
            if self.moving_average:
                opts["averaging_constant"] = self.averaging_constant
        elif self.method in HISTOGRAM_METHODS:
            opts["num_bins"] = self.num_bins
        if self.method == "entropy":
            opts["num_quantized_bins"] = self.num_quantized_bins
        if self.method == "percentile":
            opts["percentile"] = self.percentile
        if self.method == "distribution":
            opts["scenario"] = self.scenario
        if self.op_types:
            opts["op_types"] = sorted(self.op_types)
        return opts


def library_versions() -> dict[str, str]:
    from importlib.metadata import version

    return {lib: version(lib) for lib in ("onnx", "onnxruntime", "numpy")}


def _num(x: float) -> float:
    # JSON has no inf/nan; a tensor without finite values gets 0
    return float(x) if x == x and abs(x) != float("inf") else 0.0


def _told(feeds: Iterable[tuple[int, dict[str, Any]]], tell: Callable[[int, int], None],
          start: int, total: int) -> Iterator[tuple[int, dict[str, Any]]]:
    """``feeds`` unchanged, telling ``tell`` the samples handed out so far."""
    done = start
    for n, feed in feeds:
        yield n, feed
        done += n
        tell(min(done, total), total)


def calibrate(model_path: str | Path, dataset_dir: str | Path, out_dir: str | Path,
              opts: CalibrationOptions | None = None, log: Callable[[str], None] | None = None,
              scratch: str | Path | None = None,
              progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Calibrate ``model_path`` on the dataset; write the artifact into ``out_dir``.

    Returns a summary (method, num_samples, number of tensors, shas) for the rule's info.
    ``progress(done, total)`` is told the samples run so far (of both passes for the
    histogram methods).
    """
    from qbuild_onnx_common.summary import model_info

    from ..source.datasets import (
        check_dataset_against_model,
        dataset_digest,
        iter_counted_feeds,
        open_dataset,
    )
    from . import collect as cc
    from . import methods as cm

    opts = opts or CalibrationOptions()
    opts.check()
    log = log or (lambda _msg: None)
    model_path, out_dir = Path(model_path), Path(out_dir)
    ds = open_dataset(dataset_dir)
    m_info = model_info(load_model(model_path, external_data=False))
    plan = check_dataset_against_model(ds.manifest, m_info, opts.batch_size)
    if opts.method == "mean_minmax" and not plan.fixed:
        plan = replace(plan, batch_size=1)  # the mean is over samples: one per run
    # every tensor is an output of the calibration session: none may be over the bound
    # at the batch it is run with
    check_model(model_path, inputs={
        name: shape[1:] if name in plan.unbatched else (min(plan.batch_size, ds.count), *shape[1:])
        for name, (_dtype, shape) in ds.inputs.items()})
    session = cc.open_calibration_session(model_path, opts.op_types or None, opts.threads,
                                          scratch=scratch)
    log(f"calibrating {len(session.tensors)} tensors over {ds.count} samples, batch "
        f"{plan.batch_size}, method {opts.method}")
    if not session.tensors:
        raise OnnxError("the model has no float tensors to calibrate"
                               + (f" among node types {list(opts.op_types)}" if opts.op_types
                                  else ""), file=model_path)
    is_hist = opts.method in HISTOGRAM_METHODS
    absolute = opts.method == "percentile" and opts.symmetric
    mm = cc.MinMaxPass(session.tensors, opts.averaging_constant, need_abs=absolute)
    passes = 2 if is_hist else 1
    tell = progress or (lambda _done, _total: None)
    n = cc.stream(_told(iter_counted_feeds(ds, plan), tell, 0, passes * ds.count), session,
                  mm.update)
    if n == 0:
        raise OnnxError(f"no sample could be fed (dataset has {ds.count}, the model "
                               f"takes batches of exactly {plan.batch_size})",
                               file=dataset_dir)
    if n < ds.count:
        log(f"fed {n} of {ds.count} samples: the model takes batches of exactly "
            f"{plan.batch_size}")
    hp = None
    if is_hist:
        hp = cc.HistogramPass(mm.stats, opts.num_bins, absolute)
        cc.stream(_told(iter_counted_feeds(ds, plan), tell, n, 2 * n), session, hp.update)
    del session

    tensors: dict[str, Any] = {}
    for name in sorted(mm.stats):
        s = mm.stats[name]
        vmin, vmax = (s.min, s.max) if s.min <= s.max else (0.0, 0.0)
        entry: dict[str, Any] = {"min": _num(vmin), "max": _num(vmax)}
        if opts.method == "minmax":
            lo, hi = (s.ema_min, s.ema_max) \
                if opts.moving_average and s.ema_min is not None and s.ema_max is not None \
                else (vmin, vmax)
        elif opts.method == "mean_minmax":
            lo, hi = s.mean_run_range() or (vmin, vmax)
        else:
            assert hp is not None  # every method but minmax is a histogram method
            extra = cm.choose_range(opts.method, {"min": vmin, "max": vmax},
                                    hp.counts[name], hp.edges(name),
                                    {**opts.method_options(), "symmetric": opts.symmetric})
            lo, hi = extra.pop("range")
            entry.update({k: _num(v) for k, v in extra.items()})
        if opts.symmetric:
            lo, hi = cm.symmetric_range(lo, hi)
        entry["range"] = [_num(lo), _num(hi)]
        if s.nonfinite:
            entry["nonfinite"] = s.nonfinite
        tensors[name] = entry
    doc = {
        "format": FORMAT, "version": VERSION, "method": opts.method,
        "options": opts.method_options(), "symmetric": opts.symmetric,
        "model_sha256": sha256_file(model_path),
        "dataset_sha256": dataset_digest(dataset_dir),
        "num_samples": n, "batch_size": plan.batch_size,
        "libraries": library_versions(), "tensors": tensors,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / CALIBRATION_JSON).write_text(json.dumps(doc, indent=1) + "\n")
    if hp is not None:
        write_histograms(out_dir / HISTOGRAMS_NPZ, hp, sorted(mm.stats))
    return {"method": opts.method, "symmetric": opts.symmetric, "num_samples": n,
            "num_tensors": len(tensors), "model_sha256": doc["model_sha256"],
            "dataset_sha256": doc["dataset_sha256"]}


def write_histograms(path: Path, hp: HistogramPass, names: list[str]) -> None:
    """Write ``histograms.npz`` byte-for-byte reproducibly (fixed zip timestamps)."""
    import numpy as np

    arrays = {
        "names": np.array(names, dtype=np.str_),
        "counts": np.stack([hp.counts[n] for n in names]).astype(np.int64),
        "edges": np.stack([hp.edges(n) for n in names]).astype(np.float32),
        "kind": np.array("abs" if hp.absolute else "value"),
    }
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for key, arr in arrays.items():
            buf = io.BytesIO()
            np.lib.format.write_array(buf, arr, allow_pickle=False)
            info = zipfile.ZipInfo(key + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            z.writestr(info, buf.getvalue())


def load_calibration(path: str | Path) -> dict[str, Any]:
    """Read ``calibration.json`` (or the directory holding it); checks format and version."""
    p = Path(path)
    if p.is_dir():
        p = p / CALIBRATION_JSON
    try:
        doc = json.loads(p.read_text())
    except FileNotFoundError:
        raise OnnxError("calibration file does not exist", file=p) from None
    except ValueError as e:
        raise OnnxError(f"calibration file is not valid JSON: {e}", file=p) from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise OnnxError(f"not a qbuild calibration file (format {doc.get('format')!r})"
                               if isinstance(doc, dict) else "not a qbuild calibration file",
                               file=p)
    if doc.get("version") != VERSION:
        raise OnnxError(f"calibration format version {doc.get('version')} is not "
                               f"supported (expected {VERSION}); recalibrate", file=p)
    return doc


def check_calibration_matches_model(calib: dict[str, Any], model_path: str | Path,
                                    calib_path: str | Path | None = None) -> None:
    """Raise when ``calib`` was computed on a different model file than ``model_path``."""
    model_path = Path(model_path)
    actual = sha256_file(model_path)
    expected = calib.get("model_sha256")
    if actual != expected:
        where = f" in {calib_path}" if calib_path else ""
        raise OnnxError(
            f"the calibration statistics{where} were computed on a different model "
            f"(sha256 {str(expected)[:12]}…) than {model_path.name} (sha256 {actual[:12]}…). "
            "Calibrate the exact model you quantize: point the calibrate target's 'model' at "
            "the same target (usually the quant_preprocess output) and rebuild.",
            file=model_path)
