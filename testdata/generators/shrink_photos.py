"""Makes testdata/photos/ from the project's development corpus (images/devset, 89
photographs, sources and licences in its MANIFEST.md) and prints the NOTICE section that
attributes them.

Each photograph keeps its corpus name. A JPEG whose longest side is at most 640 px is
copied byte for byte; every other file is converted to RGB (greyscale stays greyscale),
resized with Pillow's LANCZOS filter so its longest side is 640 px (when larger) and
written as JPEG quality 85 without metadata. The one greyscale PNG is kept as it is,
so the shipped set still exercises the PNG and greyscale decoders. Only files whose
licence is MIT, Apache-2.0 or BSD-3-Clause (as the manifest names it) are taken;
anything else stops the script.

Run: python testdata/generators/shrink_photos.py CORPUS_DIR [OUT_DIR] > notice.txt
(CORPUS_DIR holds MANIFEST.md and images/devset/).
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

from PIL import Image

LONGEST = 640
QUALITY = 85
KEPT_AS_IS = ("skimage_camera_gray.png",)
ALLOWED = ("MIT", "Apache-2.0", "BSD-3-Clause")
_ROW = re.compile(r"^\| `images/devset/([^`]+)` \| ([^|]+?) @ `([0-9a-f]+)` : `([^`]+)` \| "
                  r"([^|]+?) \|[^|]*\|[^|]*\| ([^|]+?) \|")


def manifest_rows(manifest: Path) -> list[dict[str, str]]:
    """The devset table of MANIFEST.md: file, repository, commit, path, licence and what
    the corpus changed ("no (byte-identical)...", "resized from ...", "re-encoded ...")."""
    rows = []
    for line in manifest.read_text(encoding="utf-8").splitlines():
        m = _ROW.match(line)
        if m:
            rows.append(dict(zip(("file", "repo", "commit", "path", "licence", "changed"),
                                 (g.strip() for g in m.groups()), strict=True)))
    return rows


def licence_ok(licence: str) -> bool:
    # "MIT OR Apache-2.0", "BSD-3-Clause repo; image CC0", ...: the repository's own
    # licence comes first, and every alternative it names must be one of ALLOWED
    repo_part = licence.split(";")[0].replace(" repo", "").strip()
    return all(p.strip() in ALLOWED for p in repo_part.split(" OR "))


def shrink(src: Path, out_dir: Path, changed: str) -> tuple[str, str]:
    """(written name, what was done to the upstream file) for one photograph; ``changed``
    is what the corpus had already done to it."""
    was_png = "was PNG" in changed
    with Image.open(src) as im:
        im.load()
        fmt, size = im.format, im.size
        if src.name in KEPT_AS_IS or (fmt == "JPEG" and max(size) <= LONGEST):
            shutil.copyfile(src, out_dir / src.name)
            if changed.startswith("no (byte-identical)"):
                return src.name, "unmodified"
            return src.name, ("resized, " if "resized" in changed else "") + \
                "re-encoded as JPEG" + (" (was PNG)" if was_png else "")
        rgb = im.convert("L" if im.mode in ("L", "I;16") else "RGB")
    was_png = was_png or fmt == "PNG"
    scale = LONGEST / max(size)
    resized = "resized" in changed
    if scale < 1:
        new = (max(1, round(size[0] * scale)), max(1, round(size[1] * scale)))
        rgb = rgb.resize(new, Image.Resampling.LANCZOS)
        resized = True
    done = (f"resized to {LONGEST} px, " if resized else "") + \
        f"re-encoded as JPEG q{QUALITY}" + (" (was PNG)" if was_png else "")
    name = Path(src.name).with_suffix(".jpg").name
    rgb.save(out_dir / name, "JPEG", quality=QUALITY, optimize=True)
    return name, done


def main(corpus: Path, out_dir: Path) -> None:
    rows = manifest_rows(corpus / "MANIFEST.md")
    bad = [r for r in rows if not licence_ok(r["licence"])]
    if bad:
        sys.exit(f"licence not MIT/Apache-2.0/BSD: {bad[0]['file']} ({bad[0]['licence']})")
    out_dir.mkdir(parents=True, exist_ok=True)
    by_source: dict[tuple[str, str, str], list[str]] = {}
    for r in rows:
        name, done = shrink(corpus / "images" / "devset" / r["file"], out_dir, r["changed"])
        key = (r["repo"], r["commit"], r["licence"])
        by_source.setdefault(key, []).append(f"{name} ({r['path']}; {done})")
    for (repo, commit, licence), files in sorted(by_source.items()):
        print(f"- {repo} @ {commit}. {licence}.")
        for f in files:
            print(f"    {f}")


if __name__ == "__main__":
    root = Path(__file__).resolve().parents[2]
    main(Path(sys.argv[1]), Path(sys.argv[2]) if len(sys.argv) > 2
         else root / "testdata" / "photos")
