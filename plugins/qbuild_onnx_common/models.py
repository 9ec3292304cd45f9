"""Loading ONNX models, and models whose weights live in external data files, handled
without a second copy.

``load_model`` is the one way the ONNX plugins read a model file: ``onnx.load`` with
or without the external data beside it.

A protobuf message cannot exceed 2 GB, so models over 2 GB keep their weights in
external data files; and a model held in memory twice (once by onnx, once by an
onnxruntime session, or once more by a serialized copy) costs two to three times its
size. The helpers here keep the weights where they are whenever only the graph is
needed:

* ``lean_load``: the graph with every external tensor left on disk, except small ones
  (shape constants that shape inference reads), which are loaded;
* ``stage_beside``: write a (lean, edited) graph into a scratch folder next to hard
  links to the original data files, so onnxruntime opens it by path and reads the
  weights from the original files (nothing copied; onnxruntime 1.32 refuses symbolic
  links that resolve outside the model's folder);
* ``weights_readable_from``: onnxruntime's quantizer reads each weight with
  ``onnx.numpy_helper.to_array`` (which, in onnx >= 1.23, reads external data without
  storing it in the tensor) relative to the current directory: run it inside the model's
  folder and a lean graph's weights are read one at a time, never all held;
* ``fill``: load the external tensors left in a graph (e.g. weights that stayed float);
* ``weightless``: a copy of a model with its large initializers reduced to name, type and
  shape (what reports, interface checks and shape inference read), so the model itself
  can be freed once written.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:
    from google.protobuf.message import Message
    from onnx import ModelProto, TensorProto

# a model file, or the model itself (the accuracy helpers take either)
ModelSource: TypeAlias = "str | Path | ModelProto"

SMALL = 1 << 16  # external tensors up to this many bytes are loaded by lean_load


def load_model(path: str | Path, *, external_data: bool = True) -> ModelProto:
    """The model saved at ``path``; its external data files (resolved beside it) are
    loaded too unless ``external_data`` is false."""
    import onnx

    return onnx.load(str(path), load_external_data=external_data)


def _tensors(model: ModelProto) -> Iterable[TensorProto]:
    from onnx import external_data_helper

    tensors: Iterable[TensorProto] = external_data_helper._get_all_tensors(model)
    return tensors


def uses_external_data(model: ModelProto) -> bool:
    from onnx import external_data_helper

    return any(external_data_helper.uses_external_data(t) for t in _tensors(model))


def file_uses_external_data(path: str | Path) -> bool:
    return uses_external_data(load_model(path, external_data=False))


def locations(model: ModelProto) -> list[str]:
    from onnx import external_data_helper

    found = set()
    for t in _tensors(model):
        if external_data_helper.uses_external_data(t):
            found.add(str(external_data_helper.ExternalDataInfo(t).location))
    return sorted(found)


def lean_load(path: str | Path, small: int = SMALL) -> ModelProto:
    """The model at ``path`` with external tensors over ``small`` bytes left on disk."""
    import onnx
    from onnx import external_data_helper

    path = Path(path)
    model = load_model(path, external_data=False)
    for t in _tensors(model):
        if external_data_helper.uses_external_data(t):
            info = external_data_helper.ExternalDataInfo(t)
            if info.length is not None and info.length <= small:
                external_data_helper.load_external_data_for_tensor(t, str(path.parent))
                t.data_location = onnx.TensorProto.DEFAULT
                del t.external_data[:]
    return model


def stage_beside(model: ModelProto, data_dir: str | Path, scratch: str | Path,
                 name: str = "model.onnx") -> Path:
    """Save ``model`` (lean: external tensors still referencing files in ``data_dir``) as
    ``scratch/name`` with hard links to those files; return its path."""
    import onnx

    scratch = Path(scratch)
    scratch.mkdir(parents=True, exist_ok=True)
    for loc in locations(model):
        link = scratch / loc
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.exists():
            link.unlink()
        target = Path(data_dir) / loc
        try:  # a hard link: onnxruntime refuses data paths that resolve outside the folder
            os.link(target, link)
        except OSError:  # another file system: a copy costs disk and time, not memory
            shutil.copyfile(target, link)
    out = scratch / name
    onnx.save(model, str(out))
    return out


def unstage(staged: Path) -> None:
    """Remove a ``stage_beside`` copy and its links (onnx refuses to read data files that
    have more than one hard link, so the originals must be single again before onnx
    reads them)."""
    staged = Path(staged)
    if staged.exists():
        for loc in locations(load_model(staged, external_data=False)):
            (staged.parent / loc).unlink(missing_ok=True)
        staged.unlink()


def fill(model: ModelProto, base_dir: str | Path) -> ModelProto:
    """Load every external tensor of ``model`` from ``base_dir`` (in place); return it."""
    from onnx import external_data_helper

    external_data_helper.load_external_data_for_model(model, str(base_dir))
    return model


def _copy_fields(src: Message, dst: Message, skip: str) -> None:
    for field, value in src.ListFields():
        if field.name == skip:
            continue
        repeated = getattr(field, "is_repeated", None)  # protobuf >= 6; older: label
        if repeated if repeated is not None else field.label == field.LABEL_REPEATED:
            getattr(dst, field.name).extend(value)
        elif field.message_type is not None:
            getattr(dst, field.name).CopyFrom(value)
        else:
            setattr(dst, field.name, value)


def weightless(model: ModelProto, small: int = SMALL) -> ModelProto:
    """A copy of ``model`` whose initializers over ``small`` bytes keep only name, dtype
    and dims (small ones, e.g. the shape constants shape inference reads, are copied)."""
    import onnx

    out = onnx.ModelProto()
    _copy_fields(model, out, "graph")
    _copy_fields(model.graph, out.graph, "initializer")
    for t in model.graph.initializer:
        if t.ByteSize() <= small:
            out.graph.initializer.add().CopyFrom(t)
        else:
            out.graph.initializer.add(name=t.name, data_type=t.data_type, dims=t.dims)
    return out


def rename_data_file(model_path: Path, new_name: str) -> None:
    """Point every external tensor of the saved model at ``new_name`` (one data file), and
    rename that file to it, beside the model."""
    import onnx

    proto = load_model(model_path, external_data=False)
    locs = locations(proto)
    if not locs:
        return
    if len(locs) != 1:
        raise ValueError(f"{model_path.name} spreads its weights over {len(locs)} files")
    old = model_path.parent / locs[0]
    for t in _tensors(proto):
        for entry in t.external_data:
            if entry.key == "location":
                entry.value = new_name
    os.replace(old, model_path.parent / new_name)
    onnx.save(proto, str(model_path))


def _infer_lean(model: ModelProto) -> ModelProto:
    import onnx

    return onnx.shape_inference.infer_shapes(model)


@contextlib.contextmanager
def weights_readable_from(base_dir: str | Path | None) -> Iterator[None]:
    """Run the body in ``base_dir`` (absolute), so relative external-data locations
    resolve; ``None``: nothing changes. Actions run one at a time per worker process.

    onnxruntime's dynamic quantizer (and its static one, without shape metadata) saves
    the model to a temporary folder and reloads it to infer shapes: a deep copy plus a
    full reload of every weight, and external tensors that no longer resolve. Inside
    the body that step infers shapes on the lean graph in memory instead."""
    if base_dir is None:
        yield
        return
    from onnxruntime.quantization import base_quantizer, onnx_quantizer

    patched = [(m, m.save_and_reload_model_with_shape_infer)
               for m in (base_quantizer, onnx_quantizer)]
    old = os.getcwd()
    os.chdir(base_dir)
    try:
        for m, _ in patched:
            m.save_and_reload_model_with_shape_infer = _infer_lean
        yield
    finally:
        for m, original in patched:
            m.save_and_reload_model_with_shape_infer = original
        os.chdir(old)
