"""Running a model over a dataset with chosen intermediate tensors exposed, one sample at
a time, and handing each sample's tensors to a callback (nothing is kept here)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from onnx import ModelProto
    from onnxruntime import InferenceSession

_MAX_PROTO = 2**31 - 1


def session_with_outputs(model: ModelProto, names: Sequence[str], scratch: Path | None = None,
                         source: Path | None = None) -> InferenceSession:
    """An unoptimised onnxruntime session of ``model`` (ModelProto) that also outputs
    ``names`` (the model is copied, not changed). With ``source`` (the file ``model`` was
    lean-loaded from, weights in external data) the session reads the weights from
    ``source``'s data files (see ``external_data.stage_beside``)."""
    import onnx
    from qbuild_onnx_common.ort import session as make_session

    m = onnx.ModelProto()
    m.CopyFrom(model)
    if source is not None:
        from qbuild_onnx_common.models import stage_beside

        if scratch is None:
            raise ValueError("a model with external data needs a scratch directory")
        for n in names:
            if n not in {o.name for o in m.graph.output}:
                m.graph.output.add().name = n
        path = stage_beside(m, Path(source).parent, scratch, "with_outputs.onnx")
        del m
        try:
            return make_session(str(path), optimize=False)
        finally:  # the session holds the weights: the links can go
            from qbuild_onnx_common.models import unstage

            unstage(path)
    existing = {o.name for o in m.graph.output}
    for n in names:
        if n not in existing:
            vi = onnx.ValueInfoProto()
            vi.name = n
            m.graph.output.append(vi)
    if m.ByteSize() < _MAX_PROTO:
        return make_session(m.SerializeToString(), optimize=False)
    if scratch is None:
        raise ValueError("a model over 2 GB needs a scratch directory")
    path = Path(scratch) / "with_outputs.onnx"
    onnx.save(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location="with_outputs.onnx.data")
    del m
    return make_session(str(path), optimize=False)


def stream_tensors(session: InferenceSession, names: Sequence[str],
                   feeds: Iterable[Mapping[str, Any]],
                   sink: Callable[[int, dict[str, Any]], None]) -> int:
    """Run every feed; call ``sink(sample_index, {name: array})``; return the count."""
    n = 0
    for feed in feeds:
        outs = session.run(list(names), dict(feed))
        sink(n, dict(zip(names, outs)))
        n += 1
    return n
