"""Type names for the numpy arrays the ONNX plugins pass around: ``Array`` (any dtype),
``FloatArray`` (any float dtype), ``Float32Array``, ``Float64Array``, and ``Feed`` (one
model run's inputs or outputs: tensor name -> array). They are strings for mypy, so
importing this imports no numpy."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

Array: TypeAlias = "NDArray[Any]"
FloatArray: TypeAlias = "NDArray[np.floating[Any]]"
Float32Array: TypeAlias = "NDArray[np.float32]"
Float64Array: TypeAlias = "NDArray[np.float64]"
Feed: TypeAlias = "dict[str, NDArray[Any]]"
