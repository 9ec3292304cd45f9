"""The dataset artifact: writing, reading, digesting, and matching it to a model.

A dataset is a directory holding ``dataset.json`` and one ``.npy`` file per model input::

    {"format": "qbuild-dataset", "version": 1, "count": N, "batch_size": B,
     "inputs": {"<input>": {"file": "input_0.npy", "dtype": "float32", "shape": [N, ...]}}}

Axis 0 of every array is the sample axis. Each ``.npy`` is a plain C-order array, so it
can be memory-mapped; readers here pull one batch at a time so memory stays bounded.
This module also builds datasets from ``.npy``/``.npz`` files and synthetic data; images
live in ``images``, custom readers come through the ``qbuild_dataset_readers`` hook.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from qbuild_onnx_common.allocation import check_arrays, check_shape, element_count
from qbuild_onnx_common.errors import OnnxError

if TYPE_CHECKING:
    import pluggy
    from numpy.typing import DTypeLike
    from qbuild_onnx_common.arrays import Array

# A custom dataset reader: reader(files, options) yields samples (input name -> array).
Reader = Callable[[list[Path], dict[str, Any]], Iterable[Mapping[str, Any]]]

FORMAT = "qbuild-dataset"
VERSION = 1
MANIFEST = "dataset.json"
_HEADER_BYTES = 256  # fixed .npy header size, so the sample count can be patched in at the end


# ---------------------------------------------------------------------------------------
# Writing


def _npy_header(dtype: DTypeLike, shape: tuple[int, ...]) -> bytes:
    import numpy as np

    desc = {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
            "fortran_order": False, "shape": tuple(int(d) for d in shape)}
    text = repr(desc).encode("latin1")
    total = _HEADER_BYTES
    body_len = total - 10  # magic (6) + version (2) + header length (2)
    if len(text) + 1 > body_len:
        raise OnnxError(f"array shape {shape} too long for a dataset file header")
    text = text + b" " * (body_len - len(text) - 1) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", body_len) + text


class DatasetWriter:
    """Streams samples into a dataset directory without holding them in memory.

    Args:
        out_dir: the dataset directory (created).
        inputs: input name -> (dtype, per-sample shape), in the order files are numbered.
        batch_size: the default batch size recorded in ``dataset.json``.
        meta: extra JSON-serializable provenance stored under ``"source"``.
    """

    def __init__(self, out_dir: str | Path, inputs: Mapping[str, tuple[Any, tuple[int, ...]]],
                 batch_size: int = 1, meta: Mapping[str, Any] | None = None) -> None:
        import numpy as np

        if not inputs:
            raise OnnxError("a dataset needs at least one input")
        if batch_size < 1:
            raise OnnxError(f"batch_size must be >= 1, got {batch_size}")
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.batch_size = int(batch_size)
        self.meta = dict(meta or {})
        self.count = 0
        self._specs: dict[str, tuple[Any, tuple[int, ...], str]] = {}
        self._files = {}
        for i, (name, (dtype, shape)) in enumerate(inputs.items()):
            fname = f"input_{i}.npy"
            dt = np.dtype(dtype)
            shp = tuple(int(d) for d in shape)
            self._specs[name] = (dt, shp, fname)
            f = open(self.dir / fname, "wb")
            f.write(_npy_header(dt, (0, *shp)))
            self._files[name] = f

    def add(self, sample: Mapping[str, Any]) -> None:
        """Append one sample: input name -> array of the per-sample shape."""
        self.add_many(sample, n=None)

    def add_many(self, block: Mapping[str, Any], n: int | None) -> None:
        """Append ``n`` samples (arrays with a leading sample axis), or one if ``n`` is None."""
        import numpy as np

        missing = [k for k in self._specs if k not in block]
        extra = [k for k in block if k not in self._specs]
        if missing or extra:
            raise OnnxError(f"sample inputs do not match the dataset: missing {missing}, "
                               f"unexpected {extra}")
        arrays = {}
        for name, (dt, shp, _) in self._specs.items():
            a = np.asarray(block[name])
            want = shp if n is None else (n, *shp)
            if a.shape != want:
                raise OnnxError(f"input '{name}': sample shape {list(a.shape)} differs from "
                                   f"the dataset's {list(want)}")
            if a.dtype != dt:
                raise OnnxError(f"input '{name}': sample dtype {a.dtype} differs from the "
                                   f"dataset's {dt}")
            arrays[name] = np.ascontiguousarray(a)
        for name, a in arrays.items():
            self._files[name].write(a.tobytes())
        self.count += 1 if n is None else n

    def close(self) -> dict[str, Any]:
        """Finish the files and write ``dataset.json``; returns the manifest."""
        if self.count == 0:
            for f in self._files.values():
                f.close()
            raise OnnxError("the dataset has no samples")
        manifest_inputs = {}
        for name, (dt, shp, fname) in self._specs.items():
            f = self._files[name]
            f.seek(0)
            f.write(_npy_header(dt, (self.count, *shp)))
            f.close()
            manifest_inputs[name] = {"file": fname, "dtype": dt.name,
                                     "shape": [self.count, *shp]}
        manifest = {"format": FORMAT, "version": VERSION, "count": self.count,
                    "batch_size": self.batch_size, "inputs": manifest_inputs}
        if self.meta:
            manifest["source"] = self.meta
        (self.dir / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        return manifest


def write_dataset(out_dir: str | Path, arrays: Mapping[str, Any], batch_size: int = 1,
                  meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Write whole in-memory arrays (leading sample axis) as a dataset."""
    import numpy as np

    arrays = {k: np.asarray(v) for k, v in arrays.items()}
    scalars = [k for k, v in arrays.items() if not v.ndim]
    if scalars:
        raise OnnxError(f"input '{scalars[0]}': a scalar has no sample axis; store it with a "
                           "leading axis of length N")
    counts = {k: v.shape[0] for k, v in arrays.items()}
    if len(set(counts.values())) != 1:
        raise OnnxError(f"inputs have different sample counts: {counts}")
    w = DatasetWriter(out_dir, {k: (v.dtype, v.shape[1:]) for k, v in arrays.items()},
                      batch_size=batch_size, meta=meta)
    n = next(iter(counts.values()))
    step = 64
    for s in range(0, n, step):
        w.add_many({k: v[s:s + step] for k, v in arrays.items()}, n=min(step, n - s))
    return w.close()


# ---------------------------------------------------------------------------------------
# Reading


@dataclass
class Dataset:
    """An opened dataset directory."""

    path: Path
    manifest: dict[str, Any]

    @property
    def count(self) -> int:
        return int(self.manifest["count"])

    @property
    def batch_size(self) -> int:
        return int(self.manifest["batch_size"])

    @property
    def inputs(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """Input name -> (dtype name, full shape including the sample axis)."""
        return {k: (v["dtype"], tuple(v["shape"])) for k, v in self.manifest["inputs"].items()}

    def array(self, name: str) -> Array:
        """The whole array of one input, memory-mapped read-only."""
        import numpy as np

        mapped: Array = np.load(self.path / self.manifest["inputs"][name]["file"], mmap_mode="r")
        return mapped

    def read(self, name: str, start: int, stop: int) -> Array:
        """Samples ``[start, stop)`` of one input as a fresh in-memory array.

        Reads the bytes directly instead of keeping a mapping alive, so the pages do not
        stay in the process's resident set after the batch is gone.
        """
        import numpy as np

        spec = self.manifest["inputs"][name]
        dt = np.dtype(spec["dtype"])
        sample_shape = tuple(int(d) for d in spec["shape"][1:])
        per = dt.itemsize * element_count(sample_shape)
        stop = min(stop, self.count)
        n = max(0, stop - start)
        # The manifest only declares the shape: the bytes must be in the file, and the
        # batch within the allocation bound, before the batch is allocated.
        check_shape(f"a batch of input '{name}'", (n, *sample_shape), dt,
                    file=self.path / spec["file"])
        with open(self.path / spec["file"], "rb") as f:
            offset = self._data_offset(f)
            if offset + (start + n) * per > os.fstat(f.fileno()).st_size:
                raise OnnxError(f"dataset file {spec['file']} is truncated",
                                file=self.path / spec["file"])
            out = np.empty((n, *sample_shape), dtype=dt)
            f.seek(offset + start * per)
            got = f.readinto(out.data.cast("B")) if out.nbytes else 0
        if got != out.nbytes:
            raise OnnxError(f"dataset file {spec['file']} is truncated",
                               file=self.path / spec["file"])
        return out

    @staticmethod
    def _data_offset(f: IO[bytes]) -> int:
        import numpy as np

        f.seek(0)
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            np.lib.format.read_array_header_1_0(f)
        else:
            np.lib.format.read_array_header_2_0(f)
        return f.tell()

    def iter_batches(self, batch_size: int | None = None) -> Iterator[dict[str, Any]]:
        """Yield input name -> array batches of ``batch_size`` samples (last may be short)."""
        b = int(batch_size or self.batch_size)
        if b < 1:
            raise OnnxError(f"batch_size must be >= 1, got {b}")
        for start in range(0, self.count, b):
            yield {name: self.read(name, start, start + b) for name in self.manifest["inputs"]}


def open_dataset(path: str | Path) -> Dataset:
    """Open a dataset directory, checking its manifest and files."""
    path = Path(path)
    mf = path / MANIFEST
    if not mf.is_file():
        raise OnnxError(f"not a qbuild dataset: {MANIFEST} is missing", file=path)
    try:
        manifest = json.loads(mf.read_text())
    except ValueError as e:
        raise OnnxError(f"{MANIFEST} is not valid JSON: {e}", file=mf) from None
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise OnnxError(f"unsupported dataset format {manifest.get('format')!r} version "
                           f"{manifest.get('version')!r} (expected {FORMAT!r} {VERSION})", file=mf)
    for name, spec in manifest["inputs"].items():
        if not (path / spec["file"]).is_file():
            raise OnnxError(f"input '{name}': file {spec['file']} is missing", file=path)
    return Dataset(path, manifest)


def dataset_digest(path: str | Path) -> str:
    """A stable sha256 over the manifest's content-bearing fields and every array file."""
    ds = open_dataset(path)
    h = hashlib.sha256()
    core = {"format": FORMAT, "version": VERSION, "count": ds.count,
            "inputs": {k: {"dtype": v["dtype"], "shape": v["shape"]}
                       for k, v in sorted(ds.manifest["inputs"].items())}}
    h.update(json.dumps(core, sort_keys=True).encode())
    for name in sorted(ds.manifest["inputs"]):
        f = ds.path / ds.manifest["inputs"][name]["file"]
        h.update(name.encode() + b"\0")
        with open(f, "rb") as fh:
            Dataset._data_offset(fh)  # hash the data, not the header padding
            while block := fh.read(1 << 20):
                h.update(block)
    return h.hexdigest()


def dataset_info(path: str | Path) -> dict[str, Any]:
    """What a dataset rule passes to dependents: count, batch size, inputs, digest."""
    ds = open_dataset(path)
    return {"count": ds.count, "batch_size": ds.batch_size,
            "inputs": {k: {"dtype": v["dtype"], "shape": v["shape"]}
                       for k, v in ds.manifest["inputs"].items()},
            "dataset_sha256": dataset_digest(path)}


# ---------------------------------------------------------------------------------------
# Matching a dataset to a model


@dataclass(frozen=True)
class FeedPlan:
    """How to feed a dataset to a model.

    ``batch_size``: samples per run. ``fixed``: the model accepts only that many, so a
    short last batch is skipped. ``unbatched``: inputs whose dataset arrays are
    ``[N, *model_shape]`` (each sample is a whole model input, fed one at a time).
    """

    batch_size: int
    fixed: bool = False
    unbatched: tuple[str, ...] = ()


def _fmt_shape(shape: Iterable[int | str | None]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


class InputNamesMismatch(OnnxError):
    """The dataset's input names are not the model's: a mistake in the dataset target
    (``image_dataset``'s ``input``), which consumers report there."""


def is_image_dataset(dataset_dir: str | Path) -> bool:
    """Was the dataset made by ``image_dataset`` (whose ``input`` names its one input)?"""
    source = open_dataset(dataset_dir).manifest.get("source") or {}
    return isinstance(source, dict) and source.get("kind") == "images"


def check_dataset_against_model(dataset_info: Mapping[str, Any], model_info: Mapping[str, Any],
                                batch_size: int | None = None) -> FeedPlan:
    """Check that a dataset can feed a model; return how to feed it.

    ``dataset_info``: a ``dataset.json`` manifest or a dataset rule's info (``inputs``: name
    -> {dtype, shape with the sample axis first}, ``batch_size``). ``model_info``: the
    ``onnx_model`` info (``inputs``: list of {name, dtype, shape}). A dataset array of the
    model input's rank is fed in batches along axis 0 (a fixed model dim 0 fixes the batch
    size); an array one rank higher holds whole model inputs, fed one sample per run.

    Raises OnnxError naming the input, the expected and the actual dtype/shape.
    """
    d_inputs = dataset_info["inputs"]
    m_inputs = {i["name"]: i for i in model_info["inputs"]}
    missing = [n for n in m_inputs if n not in d_inputs]
    if missing:
        raise InputNamesMismatch(f"model input '{missing[0]}' has no data in the dataset "
                           f"(dataset inputs: {', '.join(d_inputs) or 'none'})")
    extra = [n for n in d_inputs if n not in m_inputs]
    if extra:
        raise InputNamesMismatch(f"dataset input '{extra[0]}' is not an input of the model "
                           f"(model inputs: {', '.join(m_inputs)})")
    fixed: dict[str, int] = {}
    unbatched = []
    for name, mi in m_inputs.items():
        di = d_inputs[name]
        d_shape, d_dtype = list(di["shape"]), di["dtype"]
        m_shape, m_dtype = mi.get("shape"), mi.get("dtype")
        if m_dtype is not None and d_dtype != m_dtype:
            raise OnnxError(f"input '{name}': the model expects dtype {m_dtype}, the dataset "
                               f"has {d_dtype} (shape {_fmt_shape(d_shape)})")
        if m_shape is None:
            continue
        expect = f"{m_dtype} {_fmt_shape(m_shape)}"
        if len(d_shape) == len(m_shape) + 1:
            rest, compare = d_shape[1:], m_shape
            unbatched.append(name)
        elif len(d_shape) == len(m_shape):
            rest, compare = d_shape[1:], m_shape[1:]
            if m_shape and isinstance(m_shape[0], int):
                fixed[name] = m_shape[0]
        else:
            raise OnnxError(f"input '{name}': the model expects {expect} (rank "
                               f"{len(m_shape)}), the dataset has {d_dtype} "
                               f"{_fmt_shape(d_shape)} (N={d_shape[0]} samples, rank "
                               f"{len(d_shape)})")
        for axis, (want, got) in enumerate(zip(compare, rest)):
            if isinstance(want, int) and want != got:
                raise OnnxError(
                    f"input '{name}': the model expects {expect}, the dataset has {d_dtype} "
                    f"{_fmt_shape(d_shape)} (per-sample shape {_fmt_shape(rest)}; mismatch at "
                    f"model axis {axis + len(m_shape) - len(compare)}: {want} vs {got})")
    sizes = set(fixed.values()) | ({1} if unbatched else set())
    if len(sizes) > 1:
        detail = ", ".join(f"'{k}' fixes batch {v}" for k, v in sorted(fixed.items()))
        if unbatched:
            detail += ", " + ", ".join(f"'{k}' is fed one sample per run" for k in unbatched)
        raise OnnxError(f"inputs disagree on the batch size: {detail}")
    if sizes:
        (forced,) = sizes
        if batch_size is not None and batch_size != forced:
            who = next(iter(sorted(fixed))) if fixed else unbatched[0]
            raise OnnxError(f"input '{who}': the model takes exactly {forced} sample(s) per "
                               f"run, but batch_size {batch_size} was requested")
        return FeedPlan(batch_size=forced, fixed=True, unbatched=tuple(sorted(unbatched)))
    b = int(batch_size or dataset_info.get("batch_size") or 1)
    return FeedPlan(batch_size=b, fixed=False, unbatched=())


def iter_feeds(ds: Dataset, plan: FeedPlan) -> Iterator[dict[str, Any]]:
    """Yield ORT feed dicts following ``plan``. A short last batch is fed as is, unless the
    model fixes the batch size (it is then skipped: see ``fed_count``)."""
    for _, feed in iter_counted_feeds(ds, plan):
        yield feed


def iter_counted_feeds(ds: Dataset, plan: FeedPlan) -> Iterator[tuple[int, dict[str, Any]]]:
    """Like ``iter_feeds``, yielding ``(number of samples, feed)``."""
    for batch in ds.iter_batches(plan.batch_size):
        n = next(iter(batch.values())).shape[0]
        if n < plan.batch_size and plan.fixed:
            return
        if plan.unbatched:
            # ``v[0, ...]`` keeps a 0-d array for a scalar input (``v[0]`` would be a numpy
            # scalar, which onnxruntime refuses).
            batch = {k: (v[0, ...] if k in plan.unbatched else v) for k, v in batch.items()}
        yield n, batch


def fed_count(count: int, plan: FeedPlan) -> int:
    """How many of ``count`` samples ``iter_feeds`` feeds."""
    return count - count % plan.batch_size if plan.fixed else count


# ---------------------------------------------------------------------------------------
# Builders


def _load_array_spec(spec: str, files: Mapping[str, Path]) -> Array:
    """``"file.npy"`` or ``"file.npz:key"`` (file names as listed in ``files``)."""
    import numpy as np

    fname, _, key = spec.partition(":")
    path = files.get(fname)
    if path is None:
        raise OnnxError(f"'{fname}' is not one of the listed files "
                           f"({', '.join(sorted(files)) or 'none'})")
    try:
        if path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as z:
                if not key:
                    if len(z.files) != 1:
                        raise OnnxError(f"{path.name} holds arrays {z.files}; name one as "
                                           f"'{path.name}:<key>'", file=path)
                    key = z.files[0]
                if key not in z.files:
                    raise OnnxError(f"{path.name} has no array '{key}' (it has: "
                                       f"{', '.join(z.files)})", file=path)
                return np.asarray(z[key])
        if key:
            raise OnnxError(f"'{spec}': only .npz files have keys", file=path)
        mapped: Array = np.load(path, mmap_mode="r", allow_pickle=False)
        return mapped
    except OnnxError:
        raise
    except Exception as e:
        raise OnnxError(f"cannot read array: {e}", file=path) from None


def build_numpy_dataset(out_dir: str | Path, files: Iterable[str | Path],
                        mapping: Mapping[str, str], batch_size: int = 1,
                        cast: Mapping[str, str] | None = None,
                        limit: int | None = None) -> dict[str, Any]:
    """Build a dataset from ``.npy``/``.npz`` files.

    ``mapping``: model input name -> ``"file.npy"`` or ``"file.npz:key"`` (basenames of
    ``files``). When empty and there is a single ``.npz``, its keys are the input names.
    ``cast``: input name -> dtype to convert to. ``limit``: keep the first N samples.
    """
    import numpy as np

    paths = [Path(f) for f in files]
    by_name: dict[str, Path] = {}
    for p in paths:
        if p.suffix not in (".npy", ".npz"):
            raise OnnxError("only .npy and .npz files are supported", file=p)
        if p.name in by_name:
            raise OnnxError(f"two listed files are both named {p.name}", file=p)
        by_name[p.name] = p
    mapping = dict(mapping)
    if not mapping:
        npz = [p for p in paths if p.suffix == ".npz"]
        if len(npz) != 1 or len(paths) != 1:
            raise OnnxError("give a mapping (input name -> file or file.npz:key) unless "
                               "there is exactly one .npz whose keys are the input names")
        with np.load(npz[0], allow_pickle=False) as z:
            mapping = {k: f"{npz[0].name}:{k}" for k in z.files}
    arrays = {}
    for name, spec in mapping.items():
        try:
            a = _load_array_spec(spec, by_name)
        except OnnxError as e:
            raise OnnxError(f"input '{name}': {e.message}", file=e.file) from None
        if a.ndim == 0:
            raise OnnxError(f"input '{name}': '{spec}' is a scalar; store it with a leading "
                               "sample axis")
        if cast and name in cast:
            a = a.astype(np.dtype(cast[name]))
        if limit is not None:
            a = a[:limit]
        arrays[name] = a
    counts = {k: int(v.shape[0]) for k, v in arrays.items()}
    if len(set(counts.values())) > 1:
        raise OnnxError("inputs have different sample counts (axis 0): " +
                           ", ".join(f"'{k}': {v}" for k, v in counts.items()))
    return write_dataset(out_dir, arrays, batch_size=batch_size,
                         meta={"kind": "numpy", "mapping": dict(sorted(mapping.items()))})


def build_synthetic_dataset(out_dir: str | Path, model_info: Mapping[str, Any], count: int,
                            seed: int = 0, dims: Mapping[str, int] | None = None,
                            low: float = 0.0, high: float = 1.0,
                            batch_size: int = 1) -> dict[str, Any]:
    """Random data matching a model's inputs: for smoke tests only (ruins calibration).

    Batched layout: each array is ``[count, *shape[1:]]`` with the model's dim 0 as the
    sample axis. Symbolic dims take values from ``dims`` (default 1). A sample over the
    allocation bound (``qbuild_onnx_common.allocation``) is refused before it is made.
    """
    import numpy as np

    dims = dict(dims or {})
    rng = np.random.default_rng(seed)
    specs = {}
    for inp in model_info["inputs"]:
        shape = inp.get("shape")
        if shape is None:
            raise OnnxError(f"input '{inp['name']}' has no shape in the model; a synthetic "
                               "dataset cannot be generated")
        concrete = []
        for d in shape[1:]:
            if isinstance(d, int):
                concrete.append(d)
            else:
                concrete.append(int(dims.get(d, 1)) if d is not None else 1)
        specs[inp["name"]] = (np.dtype(inp["dtype"]), tuple(concrete))
    check_arrays("input", specs)  # one sample of each, generated together
    w = DatasetWriter(out_dir, specs, batch_size=batch_size,
                      meta={"kind": "synthetic", "seed": seed, "low": low, "high": high})
    for _ in range(count):
        sample = {}
        for name, (dt, shape) in specs.items():
            if dt.kind == "f":
                sample[name] = rng.uniform(low, high, size=shape).astype(dt)
            elif dt.kind in "iu":
                sample[name] = rng.integers(int(low), int(high) + 1, size=shape).astype(dt)
            elif dt.kind == "b":
                sample[name] = rng.integers(0, 2, size=shape).astype(dt)
            else:
                raise OnnxError(f"input '{name}': cannot synthesise dtype {dt}")
        w.add(sample)
    return w.close()


def build_reader_dataset(out_dir: str | Path, reader: Reader, files: list[Path],
                         options: Mapping[str, Any], batch_size: int = 1,
                         limit: int | None = None, name: str = "") -> dict[str, Any]:
    """Build a dataset from a custom reader: ``reader(files, options)`` yields samples
    (input name -> per-sample array); dtypes and shapes are fixed by the first sample."""
    import numpy as np

    w = None
    try:
        for i, sample in enumerate(reader(list(files), dict(options))):
            if limit is not None and i >= limit:
                break
            if not isinstance(sample, Mapping) or not sample:
                raise OnnxError(f"reader '{name}' yielded {type(sample).__name__}, expected a "
                                   "dict of input name -> array")
            sample = {k: np.asarray(v) for k, v in sample.items()}
            if w is None:
                w = DatasetWriter(out_dir, {k: (v.dtype, v.shape) for k, v in sample.items()},
                                  batch_size=batch_size,
                                  meta={"kind": "reader", "reader": name,
                                        "options": dict(sorted(options.items()))})
            w.add(sample)
    except OnnxError:
        raise
    except Exception as e:
        raise OnnxError(f"reader '{name}' failed: {type(e).__name__}: {e}") from e
    if w is None:
        raise OnnxError(f"reader '{name}' produced no samples")
    return w.close()


def remove_partial(out_dir: str | Path) -> None:
    """Delete a half-written dataset directory's files (after an error)."""
    p = Path(out_dir)
    if p.is_dir():
        for f in p.iterdir():
            if f.is_file():
                os.unlink(f)


# ---------------------------------------------------------------------------------------
# Custom readers (the qbuild_dataset_readers hook)


def available_readers(pm: pluggy.PluginManager | None = None) -> dict[str, Reader]:
    """Readers from every ``qbuild`` plugin. Without ``pm``, a plugin manager is built here
    from the entry points (rules run in worker processes, away from the engine's)."""
    import pluggy

    from .. import hookspecs

    if pm is None:
        pm = pluggy.PluginManager("qbuild")
        pm.add_hookspecs(hookspecs)
        pm.load_setuptools_entrypoints("qbuild")
    elif not hasattr(pm.hook, "qbuild_dataset_readers"):
        pm.add_hookspecs(hookspecs)
    found: dict[str, Reader] = {}
    for result in pm.hook.qbuild_dataset_readers():
        for name, reader in (result or {}).items():
            if name in found and found[name] is not reader:
                raise OnnxError(f"dataset reader '{name}' is provided by two plugins")
            found[name] = reader
    return found


def find_reader(name: str, pm: pluggy.PluginManager | None = None) -> Reader:
    """A reader by hook name, or by ``"package.module:function"`` reference."""
    import importlib

    if ":" in name:
        mod, _, fn = name.partition(":")
        try:
            reader: Reader = getattr(importlib.import_module(mod), fn)
            return reader
        except (ImportError, AttributeError) as e:
            raise OnnxError(f"cannot import dataset reader '{name}': {e}",
                               attr="reader") from None
    readers = available_readers(pm)
    if name not in readers:
        raise OnnxError(f"no dataset reader named '{name}' (available: "
                           f"{', '.join(sorted(readers)) or 'none'}); install the plugin that "
                           "provides it or use 'module:function'", attr="reader")
    return readers[name]
