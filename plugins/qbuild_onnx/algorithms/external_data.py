"""The external-data helpers now live in ``qbuild_onnx_common.models`` (shared with the
other ONNX plugins); this name stays for code and docs that still say
``external_data.lean_load`` and friends."""

from __future__ import annotations

from qbuild_onnx_common.models import (
    SMALL,
    file_uses_external_data,
    fill,
    lean_load,
    load_model,
    locations,
    rename_data_file,
    stage_beside,
    unstage,
    uses_external_data,
    weightless,
    weights_readable_from,
)

__all__ = ["SMALL", "file_uses_external_data", "fill", "lean_load", "load_model", "locations",
           "rename_data_file", "stage_beside", "unstage", "uses_external_data", "weightless",
           "weights_readable_from"]
