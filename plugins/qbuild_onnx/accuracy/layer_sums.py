"""Streaming statistics from which a linear layer's mean output follows exactly, in memory
the size of its weight rather than of its input.

For a Conv, the mean over samples and output positions of ``conv(x, W)`` for output
channel o is ``Σ W[o, c, k] · T[c, k] / count``, where ``T[c, k]`` sums, over every sample
and every output position, the (zero-padded) input value that kernel tap ``k`` of input
channel ``c`` multiplies there, and ``count`` is the number of output positions seen.
``T`` has the weight's shape per input channel (C × kernel), so bias correction keeps no
mean activation: it adds each run's taps and drops the run. Padding, strides,
dilations, groups and ``auto_pad`` are honoured, so the result equals the spatial mean of
``conv(x̄, W)``. For a Gemm the statistic is the sum of its input rows.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from onnx import NodeProto
    from qbuild_onnx_common.arrays import Array, Float64Array


def _attrs(node: NodeProto) -> dict[str, Any]:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


class LayerSums:
    """Running tap sums of one Conv or Gemm's input (see the module docstring)."""

    def __init__(self, node: NodeProto, weight_shape: tuple[int, ...]) -> None:
        self.op = node.op_type
        self.attrs = _attrs(node)
        self.weight_shape = tuple(weight_shape)
        self.taps: Float64Array | None = None
        self.count = 0

    def add(self, x: Array) -> None:
        """Add one run's input (any batch size); sums are kept in float64."""
        import numpy as np

        arr = np.asarray(x)
        taps, count = self._conv_taps(arr) if self.op == "Conv" else self._gemm_rows(arr)
        self.taps = taps if self.taps is None else self.taps + taps
        self.count += count

    def mean_output(self, w: Float64Array) -> Float64Array:
        """Mean over everything added of ``op(x, w)`` per output channel (no bias)."""
        import numpy as np

        assert self.taps is not None and self.count > 0
        if self.op != "Conv":
            w2 = w.T if self.attrs.get("transB", 0) else w
            gemm: Float64Array = float(self.attrs.get("alpha", 1.0)) * (self.taps @ w2)
            return gemm / self.count
        groups = int(self.attrs.get("group", 1))
        out_ch, per_group = w.shape[0], w.shape[1]
        kernel = w.shape[2:]
        t = self.taps.reshape(groups, per_group, -1)
        wg = w.reshape(groups, out_ch // groups, per_group, -1)
        conv: Float64Array = np.einsum("gock,gck->go", wg, t).reshape(out_ch)
        assert math.prod(kernel) == t.shape[2]
        return conv / self.count

    def _gemm_rows(self, x: Array) -> tuple[Float64Array, int]:
        import numpy as np

        rows = x.reshape(x.shape[0], -1) if x.ndim != 2 else x
        if self.attrs.get("transA", 0):
            rows = rows.T
        total: Float64Array = rows.sum(axis=0, dtype=np.float64)
        return total, rows.shape[0]

    def _pads(self, spatial: tuple[int, ...], kernel: tuple[int, ...],
              strides: list[int], dilations: list[int]) -> tuple[list[int], list[int]]:
        auto = self.attrs.get("auto_pad", b"NOTSET")
        auto = auto.decode() if isinstance(auto, bytes) else str(auto)
        n = len(spatial)
        if auto in ("SAME_UPPER", "SAME_LOWER"):
            begin, end = [], []
            for size, k, s, d in zip(spatial, kernel, strides, dilations):
                total = max((math.ceil(size / s) - 1) * s + d * (k - 1) + 1 - size, 0)
                small, large = total // 2, total - total // 2
                begin.append(small if auto == "SAME_UPPER" else large)
                end.append(large if auto == "SAME_UPPER" else small)
            return begin, end
        if auto == "VALID":
            return [0] * n, [0] * n
        pads = list(self.attrs.get("pads", [0] * (2 * n)))
        return pads[:n], pads[n:]

    def _conv_taps(self, x: Array) -> tuple[Float64Array, int]:
        import numpy as np

        kernel = self.weight_shape[2:]
        n = len(kernel)
        strides = list(self.attrs.get("strides", [1] * n))
        dilations = list(self.attrs.get("dilations", [1] * n))
        spatial = tuple(x.shape[2:])
        begin, end = self._pads(spatial, kernel, strides, dilations)
        out = [(size + b + e - d * (k - 1) - 1) // s + 1
               for size, b, e, k, s, d in zip(spatial, begin, end, kernel, strides, dilations)]
        # every sample has the same tap positions: sum the batch first
        arr: Float64Array = x.sum(axis=0, dtype=np.float64)  # [C, *spatial]
        # one spatial axis at a time (the window of a tap is a product of per-axis index
        # ranges): [C, *rest, *taps so far] -> [C, *rest[1:], *taps so far, k]
        for size, b, k, s, d, m in zip(spatial, begin, kernel, strides, dilations, out):
            per_tap = []
            for o in range(k):
                first, last = _inside(o * d - b, s, m, size)
                if first > last:  # this tap only ever meets padding
                    per_tap.append(np.zeros(arr.shape[:1] + arr.shape[2:]))
                    continue
                start = o * d - b + s * first
                part = arr[:, start:start + s * (last - first) + 1:s]
                per_tap.append(part.sum(axis=1))
            arr = np.stack(per_tap, axis=-1)
        return arr, x.shape[0] * math.prod(out)


def _inside(offset: int, stride: int, count: int, size: int) -> tuple[int, int]:
    """The output positions j in [0, count) whose input index offset + stride * j falls
    inside [0, size) (the others read zero padding): (first, last), empty if first > last."""
    first = max(0, -(offset // stride))  # ceil(-offset / stride)
    last = min(count - 1, (size - 1 - offset) // stride) if size - 1 - offset >= 0 else -1
    return first, last
