"""Models whose weights live in external data files, handled without a second copy.

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
* ``fill``: load the weights into a lean graph once it is ready to be quantized.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

SMALL = 1 << 16  # external tensors up to this many bytes are loaded by lean_load


def _tensors(model):
    from onnx import external_data_helper

    return external_data_helper._get_all_tensors(model)


def uses_external_data(model) -> bool:
    from onnx import external_data_helper

    return any(external_data_helper.uses_external_data(t) for t in _tensors(model))


def file_uses_external_data(path: str | Path) -> bool:
    import onnx

    return uses_external_data(onnx.load(str(path), load_external_data=False))


def locations(model) -> list[str]:
    from onnx import external_data_helper

    found = set()
    for t in _tensors(model):
        if external_data_helper.uses_external_data(t):
            found.add(external_data_helper.ExternalDataInfo(t).location)
    return sorted(found)


def lean_load(path: str | Path, small: int = SMALL):
    """The model at ``path`` with external tensors over ``small`` bytes left on disk."""
    import onnx
    from onnx import external_data_helper

    path = Path(path)
    model = onnx.load(str(path), load_external_data=False)
    for t in _tensors(model):
        if external_data_helper.uses_external_data(t):
            info = external_data_helper.ExternalDataInfo(t)
            if info.length is not None and info.length <= small:
                external_data_helper.load_external_data_for_tensor(t, str(path.parent))
                t.data_location = onnx.TensorProto.DEFAULT
                del t.external_data[:]
    return model


def stage_beside(model, data_dir: str | Path, scratch: str | Path, name: str = "model.onnx"
                 ) -> Path:
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


def fill(model, base_dir: str | Path) -> Any:
    """Load every external tensor of ``model`` from ``base_dir`` (in place); return it."""
    from onnx import external_data_helper

    external_data_helper.load_external_data_for_model(model, str(base_dir))
    return model


def rename_data_file(model_path: Path, new_name: str) -> None:
    """Point every external tensor of the saved model at ``new_name`` (one data file), and
    rename that file to it, beside the model."""
    import onnx

    proto = onnx.load(str(model_path), load_external_data=False)
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
