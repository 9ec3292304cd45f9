"""Image datasets: decode images of any common mode, then resize, normalise and lay them
out as one model input.

Owns the pixel pipeline: decoding (EXIF orientation; greyscale, palette, 16-bit and
CMYK images; alpha composited onto a background), optional seeded augmentation (random
crops and flips, so a few images give many calibration samples), geometry (stretch,
letterbox with a pad value at the top-left or centred, or resize-and-centre-crop),
colour order, ``(pixel * scale - mean) / std`` and NCHW/NHWC layout. Pixels are kept
in float32 in the 0..255 range until normalisation, so 16-bit sources keep precision.
Which images of a folder a dataset takes (one set of a disjoint split) is ``splits``'s;
the manifest records every source image's content digest.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qbuild_onnx_common.allocation import check_shape
from qbuild_onnx_common.errors import OnnxError

from .datasets import DatasetWriter
from .splits import ALL, DEFAULT_FRACTIONS, split_files

if TYPE_CHECKING:
    import numpy as np
    from PIL import Image
    from qbuild_onnx_common.arrays import Array, Float32Array

# luma weights of ITU-R BT.601, for colour -> grey
_LUMA = (0.299, 0.587, 0.114)

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm",
                  ".pgm", ".pbm")
RESIZE_MODES = ("stretch", "letterbox", "crop")
ALIGNS = ("center", "topleft")
COLORS = ("RGB", "BGR", "GRAY")
LAYOUTS = ("NCHW", "NHWC")
INTERPOLATIONS = ("bilinear", "bicubic", "nearest", "lanczos")
DTYPES = ("float32", "float16", "uint8", "int8")
_CACHE_BYTES = 256 << 20


@dataclass(frozen=True)
class ImageOptions:
    """How images become one model input (see the module docstring)."""

    height: int
    width: int
    resize: str = "stretch"
    align: str = "center"
    pad_value: float = 114.0
    color: str = "RGB"
    scale: float = 1.0 / 255.0
    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (1.0,)
    layout: str = "NCHW"
    dtype: str = "float32"
    background: tuple[float, float, float] = (255.0, 255.0, 255.0)
    interpolation: str = "bilinear"
    count: int | None = None  # total samples; more than the images -> augmented copies
    seed: int = 0
    flip: bool = True
    min_scale: float = 0.5  # smallest crop area fraction used by augmentation
    extra: dict[str, Any] = field(default_factory=dict)

    def check(self) -> None:
        def bad(attr: str, msg: str) -> OnnxError:
            return OnnxError(msg, attr=attr)

        if self.height < 1 or self.width < 1:
            raise bad("size", f"image size must be positive, got {self.height}x{self.width}")
        for attr, value, allowed in (("resize", self.resize, RESIZE_MODES),
                                     ("align", self.align, ALIGNS),
                                     ("color", self.color, COLORS),
                                     ("layout", self.layout, LAYOUTS),
                                     ("interpolation", self.interpolation, INTERPOLATIONS),
                                     ("dtype", self.dtype, DTYPES)):
            if value not in allowed:
                raise bad(attr, f"'{value}' is not one of {', '.join(allowed)}")
        channels = 1 if self.color == "GRAY" else 3
        for attr, vals in (("mean", self.mean), ("std", self.std)):
            if len(vals) not in (1, channels):
                raise bad(attr, f"needs 1 or {channels} values for color {self.color}, got "
                                f"{len(vals)}")
        if any(s == 0 for s in self.std):
            raise bad("std", "std values must be non-zero")
        if not 0 < self.min_scale <= 1:
            raise bad("augment", f"min_scale must be in (0, 1], got {self.min_scale}")
        if self.count is not None and self.count < 1:
            raise bad("count", f"count must be >= 1, got {self.count}")

    @property
    def channels(self) -> int:
        return 1 if self.color == "GRAY" else 3

    def sample_shape(self) -> tuple[int, int, int]:
        c, h, w = self.channels, self.height, self.width
        return (c, h, w) if self.layout == "NCHW" else (h, w, c)


def list_images(sources: Iterable[str | Path]) -> list[Path]:
    """Expand folders to the image files inside them (not recursive); sort everything."""
    found: list[Path] = []
    for src in sources:
        p = Path(src)
        if p.is_dir():
            found.extend(f for f in p.iterdir()
                         if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES)
        elif p.is_file():
            found.append(p)
        else:
            raise OnnxError("image file or folder does not exist", file=p)
    return sorted(set(found), key=lambda f: f.as_posix())


def decode_image(path: str | Path, background: Sequence[float] = (255.0, 255.0, 255.0)
                 ) -> Float32Array:
    """Decode to (float32 HxWxC array in 0..255, C = 1 or 3), compositing any alpha."""
    import numpy as np
    from PIL import Image, ImageOps, UnidentifiedImageError

    path = Path(path)
    try:
        with Image.open(path) as im:
            im.load()
            im = ImageOps.exif_transpose(im) or im
    except UnidentifiedImageError:
        raise OnnxError("not an image Pillow can read", file=path) from None
    except OSError as e:
        raise OnnxError(f"cannot decode image: {e}", file=path) from None
    alpha = None
    mode = im.mode
    if mode == "P":
        im = im.convert("RGBA" if "transparency" in im.info else "RGB")
    elif mode == "PA":
        im = im.convert("RGBA")
    elif mode == "RGBa":
        im = im.convert("RGBA")
    elif mode == "La":
        im = im.convert("LA")
    elif mode == "1":
        im = im.convert("L")
    elif mode in ("CMYK", "YCbCr", "LAB", "HSV"):
        im = im.convert("RGB")
    mode = im.mode
    if mode.startswith("I;16"):
        arr = np.asarray(im, dtype=np.float32) / 257.0  # 0..65535 -> 0..255
    elif mode == "I":
        raw = np.asarray(im)
        # 32-bit integer images come from 16-bit sources in practice; scale by the format max
        arr = raw.astype(np.float32) / (257.0 if raw.max(initial=0) > 255 else 1.0)
    elif mode == "F":
        arr = np.clip(np.asarray(im, dtype=np.float32), 0.0, 255.0)
    elif mode in ("L", "RGB"):
        arr = np.asarray(im, dtype=np.float32)
    elif mode in ("LA", "RGBA"):
        full = np.asarray(im, dtype=np.float32)
        arr, alpha = full[..., :-1], full[..., -1:] / 255.0
    else:
        arr = np.asarray(im.convert("RGB"), dtype=np.float32)
    if arr.ndim == 2:
        arr = arr[..., None]
    if alpha is not None:
        bg = np.asarray(background, dtype=np.float32)
        if arr.shape[-1] == 1:
            luma = np.asarray(_LUMA, dtype=np.float32)
            bg = bg[:1] if bg.size == 1 else np.asarray([bg @ luma], dtype=np.float32)
        arr = arr * alpha + bg * (1.0 - alpha)
    return np.ascontiguousarray(arr, dtype=np.float32)


def _resample(name: str) -> Image.Resampling:
    from PIL import Image

    return {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC,
            "nearest": Image.Resampling.NEAREST, "lanczos": Image.Resampling.LANCZOS}[name]


def _resize(arr: Float32Array, h: int, w: int, interpolation: str) -> Float32Array:
    """Resize a float HxWxC array channel by channel (Pillow mode F keeps precision)."""
    import numpy as np
    from PIL import Image

    if arr.shape[0] == h and arr.shape[1] == w:
        return arr
    out = np.empty((h, w, arr.shape[2]), dtype=np.float32)
    for c in range(arr.shape[2]):
        ch = Image.fromarray(np.ascontiguousarray(arr[..., c]), mode="F")
        out[..., c] = np.asarray(ch.resize((w, h), _resample(interpolation)), dtype=np.float32)
    return out


def _augment(arr: Float32Array, rng: np.random.Generator, opts: ImageOptions
             ) -> Float32Array:
    """A random crop (area fraction in [min_scale, 1], aspect 3/4..4/3) and maybe a flip."""
    h, w = arr.shape[:2]
    area = rng.uniform(opts.min_scale, 1.0)
    aspect = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
    cw = min(w, max(1, round(math.sqrt(area * aspect) * w)))
    ch = min(h, max(1, round(math.sqrt(area / aspect) * h)))
    y0 = int(rng.integers(0, h - ch + 1))
    x0 = int(rng.integers(0, w - cw + 1))
    arr = arr[y0:y0 + ch, x0:x0 + cw]
    if opts.flip and rng.random() < 0.5:
        arr = arr[:, ::-1]
    return arr


def _geometry(arr: Float32Array, opts: ImageOptions) -> Float32Array:
    import numpy as np

    H, W = opts.height, opts.width
    h, w = arr.shape[:2]
    if opts.resize == "stretch":
        return _resize(arr, H, W, opts.interpolation)
    if opts.resize == "letterbox":
        r = min(H / h, W / w)
        nh, nw = max(1, min(H, round(h * r))), max(1, min(W, round(w * r)))
        canvas = np.full((H, W, arr.shape[2]), opts.pad_value, dtype=np.float32)
        y0, x0 = ((H - nh) // 2, (W - nw) // 2) if opts.align == "center" else (0, 0)
        canvas[y0:y0 + nh, x0:x0 + nw] = _resize(arr, nh, nw, opts.interpolation)
        return canvas
    # "crop": scale so the image covers the target, then cut the centre
    r = max(H / h, W / w)
    nh, nw = max(H, round(h * r)), max(W, round(w * r))
    big = _resize(arr, nh, nw, opts.interpolation)
    y0, x0 = (nh - H) // 2, (nw - W) // 2
    return big[y0:y0 + H, x0:x0 + W]


def _finish(arr: Float32Array, opts: ImageOptions) -> Array:
    """Colour order, normalisation, layout, dtype."""
    import numpy as np

    c = arr.shape[2]
    if opts.color == "GRAY":
        if c == 3:
            arr = arr @ np.asarray(_LUMA, dtype=np.float32)
            arr = arr[..., None]
    else:
        if c == 1:
            arr = np.repeat(arr, 3, axis=2)
        if opts.color == "BGR":
            arr = arr[..., ::-1]
    mean = np.asarray(opts.mean, dtype=np.float32)
    std = np.asarray(opts.std, dtype=np.float32)
    x = (arr.astype(np.float32) * np.float32(opts.scale) - mean) / std
    if opts.layout == "NCHW":
        x = np.transpose(x, (2, 0, 1))
    dt = np.dtype(opts.dtype)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        x = np.clip(np.rint(x), info.min, info.max)
    return np.ascontiguousarray(x.astype(dt))


def image_to_sample(path: str | Path, opts: ImageOptions,
                    augment_rng: np.random.Generator | None = None) -> Array:
    """One image file -> one per-sample array (C,H,W or H,W,C)."""
    arr = decode_image(path, opts.background)
    if augment_rng is not None:
        arr = _augment(arr, augment_rng, opts)
    return _finish(_geometry(arr, opts), opts)


def build_image_dataset(out_dir: str | Path, sources: Iterable[str | Path], input_name: str,
                        opts: ImageOptions, batch_size: int = 1, split: str = ALL,
                        split_fractions: Sequence[float] = DEFAULT_FRACTIONS,
                        split_seed: int = 0) -> dict[str, Any]:
    """Write a dataset with one input from images, in sorted file order.

    ``split`` (``calibration``, ``selection`` or ``evaluation``) keeps only the images
    of that set of the split of ``sources`` by content (``splits``); ``all`` keeps them
    all. With ``opts.count`` larger than the number of images, sample ``k`` comes from
    image ``k mod n``; the first ``n`` are the images as they are, later ones are
    augmented with a generator seeded by ``(seed, k)``, so every sample is reproducible
    on its own.
    """
    import numpy as np

    opts.check()
    found = list_images(sources)
    if not found:
        raise OnnxError("no image files found")
    files, digests, set_sizes = split_files(found, split, split_fractions, split_seed)
    if not files:
        raise OnnxError(f"the {split} set of these {len(found)} images is empty "
                        f"(split_fractions {list(split_fractions)}, split_seed "
                        f"{split_seed}): add images or give it a larger fraction",
                        attr="split")
    count = opts.count or len(files)
    # each sample is made in float32 at the requested size before its dtype is applied
    check_shape(f"a sample of input '{input_name}'", opts.sample_shape(), np.float32)
    meta: dict[str, Any] = {"kind": "images", "images": [f.name for f in files],
                            "image_sha256": digests, "count": count,
                            # what labelled metrics need to map boxes to the images
                            "geometry": {"size": [opts.height, opts.width],
                                         "resize": opts.resize, "align": opts.align}}
    if split != ALL:
        meta["split"] = {"set": split, "fractions": list(split_fractions),
                         "seed": split_seed, "sizes": set_sizes}
    w = DatasetWriter(out_dir, {input_name: (np.dtype(opts.dtype), opts.sample_shape())},
                      batch_size=batch_size, meta=meta)
    sizes: list[list[int]] = []
    # Augmented samples revisit every image in turn; keep decoded images while they fit.
    cache: dict[int, Any] = {}
    cached_bytes = 0
    for k in range(count):
        i = k % len(files)
        arr = cache.get(i)
        if arr is None:
            arr = decode_image(files[i], opts.background)
            if k < len(files):
                sizes.append([int(arr.shape[0]), int(arr.shape[1])])
            if count > len(files) and cached_bytes + arr.nbytes <= _CACHE_BYTES:
                cache[i] = arr
                cached_bytes += arr.nbytes
        if k >= len(files):
            arr = _augment(arr, np.random.default_rng([opts.seed, k]), opts)
        w.add({input_name: _finish(_geometry(arr, opts), opts)})
    w.meta["sizes"] = sizes  # decoded [h, w] of each image, in sample order
    return w.close()
