"""Disjoint, deterministic splits of one image folder into a calibration, a selection and
an evaluation set, and the check that two datasets share no content.

Each image goes to a set by a hash of its **content** (the sha256 of the file's bytes)
and the split seed, never by its name, path or position: the same photograph lands in
the same set on every machine, after a rename or a move, and whatever other files sit
in the folder. The hash gives each image a point in [0, 1); the cumulative fractions cut
that interval into the three sets, so they are disjoint by construction (identical files
share a digest and so always share a set), and adding or removing images never moves
another image from one set to another. The price of that stability: set sizes follow
the fractions only on average (a binomial spread), so the datasets record and the reports
show the counts.

An image dataset records the digest of every source image it used (``image_sha256`` in
its manifest); two datasets overlap when they share one. Datasets that record no source
images are compared sample by sample.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from qbuild_onnx_common.errors import OnnxError

SETS = ("calibration", "selection", "evaluation")
ALL = "all"
DEFAULT_FRACTIONS = (0.3, 0.35, 0.35)
_DOMAIN = b"qbuild-split-v1\0"


def content_digest(path: str | Path) -> str:
    """The sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def split_point(digest: str, seed: int) -> float:
    """Where an image with this content digest falls in [0, 1) for ``seed``."""
    h = hashlib.sha256(_DOMAIN + seed.to_bytes(8, "little", signed=True)
                       + bytes.fromhex(digest))
    return int.from_bytes(h.digest()[:8], "big") / 2.0**64


def check_fractions(fractions: Sequence[float]) -> str | None:
    """What is wrong with ``fractions`` as one sentence, or None."""
    if len(fractions) != len(SETS):
        return (f"give {len(SETS)} fractions ({', '.join(SETS)}), got "
                f"{len(fractions)}")
    if any(f < 0 for f in fractions):
        return f"fractions must not be negative, got {list(fractions)}"
    if abs(sum(fractions) - 1.0) > 1e-6:
        return f"fractions must add up to 1, got {list(fractions)} (sum {sum(fractions):g})"
    return None


def set_of(digest: str, fractions: Sequence[float], seed: int) -> str:
    """The set (one of ``SETS``) an image with this content digest belongs to."""
    u = split_point(digest, seed)
    edge = 0.0
    for name, fraction in zip(SETS, fractions, strict=True):
        edge += fraction
        if u < edge:
            return name
    return SETS[-1]  # sum(fractions) a rounding error below 1


def split_files(files: Iterable[Path], which: str, fractions: Sequence[float], seed: int
                ) -> tuple[list[Path], list[str], dict[str, int]]:
    """The files of set ``which`` (or every file for ``"all"``) in the given order, their
    content digests, and how many of ``files`` fell in each set."""
    problem = check_fractions(fractions)
    if problem:
        raise OnnxError(problem, attr="split_fractions")
    if which != ALL and which not in SETS:
        raise OnnxError(f"'{which}' is not one of {ALL}, {', '.join(SETS)}", attr="split")
    kept: list[Path] = []
    digests: list[str] = []
    sizes = dict.fromkeys(SETS, 0)
    for f in files:
        digest = content_digest(f)
        where = set_of(digest, fractions, seed)
        sizes[where] += 1
        if which in (ALL, where):
            kept.append(f)
            digests.append(digest)
    return kept, digests, sizes


# ---------------------------------------------------------------------------------------
# Overlap between two datasets


def _image_digests(manifest: dict[str, Any]) -> dict[str, str] | None:
    """digest -> image name of an image dataset's sources (None: none recorded)."""
    source = manifest.get("source") or {}
    digests = source.get("image_sha256") if isinstance(source, dict) else None
    if not isinstance(digests, list):
        return None
    return dict(zip(digests, source.get("images") or digests, strict=False))


def _sample_digests(path: Path) -> dict[str, str]:
    """digest -> 'sample k' of every sample of a dataset (all its inputs together)."""
    from .datasets import open_dataset

    ds = open_dataset(path)
    found: dict[str, str] = {}
    names = sorted(ds.manifest["inputs"])
    for k in range(ds.count):
        h = hashlib.sha256()
        for name in names:
            h.update(name.encode() + b"\0" + ds.read(name, k, k + 1).tobytes())
        found.setdefault(h.hexdigest(), f"sample {k}")
    return found


def shared_content(a: Path, b: Path) -> tuple[str, list[str]]:
    """What two dataset directories have in common: ("images" or "samples", the shared
    items named as in ``b``). Image datasets are compared by their source images' content
    digests, others by their samples' bytes."""
    from .datasets import open_dataset

    ia, ib = _image_digests(open_dataset(a).manifest), _image_digests(open_dataset(b).manifest)
    if ia is not None and ib is not None:
        return "images", sorted(ib[d] for d in ib.keys() & ia.keys())
    sa, sb = _sample_digests(a), _sample_digests(b)
    return "samples", sorted((sb[d] for d in sb.keys() & sa.keys()),
                             key=lambda s: int(s.split()[-1]))
