"""Issue 25 point 2: ``image_dataset``'s ``split`` takes one set of a disjoint split of a
folder, by the content of each image (never its name, place or order), through the real
rule; ``auto_quantize`` refuses a selection set that shares images with its calibration
set; the shipped photographs (testdata/photos) split the same way on every machine."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from qbuild_onnx.source.images import list_images
from qbuild_onnx.source.splits import SETS, content_digest, set_of, split_files

ROOT = Path(__file__).resolve().parents[2]
PHOTOS = ROOT / "testdata" / "photos"
MOBILENET = ROOT / "testdata" / "models" / "mobilenet_v2_128_0.5.onnx"
FRACTIONS = (0.3, 0.35, 0.35)

BUILD = """
[photos]
rule = "image_dataset"
images = ["photos"]
input = "input_1:0"
size = [32, 32]
split = "calibration"
{extra}
variants = {{ select = {{ split = "selection" }}, eval = {{ split = "evaluation" }} }}
"""


def _photos(ws, names: list[str], folder: str = "d/photos") -> None:
    for name in names:
        ws.copy(PHOTOS / name, f"{folder}/{name}")


def _manifest(outcome, label: str) -> dict:
    data = next(p for p in outcome.outputs(label) if p.name == "data")
    return json.loads((data / "dataset.json").read_text())


FIRST_24 = sorted(p.name for p in PHOTOS.iterdir() if p.suffix in (".jpg", ".png"))[:24]


def test_the_three_sets_are_disjoint_and_cover_the_folder(qbuild_workspace):
    ws = qbuild_workspace
    _photos(ws, FIRST_24)
    ws.write("d/BUILD.toml", BUILD.format(extra=""))
    r = ws.build("//d:photos", "//d:photos.select", "//d:photos.eval")
    assert r.ok, r.error
    sets = {label: _manifest(r, label)["source"]
            for label in ("//d:photos", "//d:photos.select", "//d:photos.eval")}
    digests = [set(s["image_sha256"]) for s in sets.values()]
    assert all(digests), "each set has images"
    assert not (digests[0] & digests[1] or digests[0] & digests[2] or digests[1] & digests[2])
    everything = {content_digest(PHOTOS / n) for n in FIRST_24}
    assert digests[0] | digests[1] | digests[2] == everything
    sizes = sets["//d:photos"]["split"]["sizes"]
    assert sum(sizes.values()) == 24
    assert [len(d) for d in digests] == [sizes[s] for s in SETS]
    assert sets["//d:photos.eval"]["split"] == {"set": "evaluation", "fractions": [0.3, 0.35, 0.35],
                                                 "seed": 0, "sizes": sizes}


def test_a_split_follows_content_not_names_order_or_neighbours(tmp_path):
    originals = [PHOTOS / n for n in FIRST_24]
    # the same photographs renamed, in another folder, with other photographs beside them
    moved = tmp_path / "moved"
    moved.mkdir()
    renamed = {}
    for i, src in enumerate(reversed(originals)):
        dest = moved / f"{i:03d}_{src.stem[::-1]}{src.suffix}"
        shutil.copyfile(src, dest)
        renamed[content_digest(src)] = dest
    for extra in sorted(PHOTOS.iterdir())[30:40]:
        shutil.copyfile(extra, moved / extra.name)
    for which in SETS:
        kept, digests, _ = split_files(originals, which, FRACTIONS, 0)
        kept_moved, digests_moved, _ = split_files(list_images([moved]), which, FRACTIONS, 0)
        assert set(digests) <= set(digests_moved), which
        assert {renamed[d] for d in digests} <= set(kept_moved)
    # another seed is another split
    one = [set_of(content_digest(p), FRACTIONS, 0) for p in originals]
    other = [set_of(content_digest(p), FRACTIONS, 1) for p in originals]
    assert one != other


def test_identical_files_always_share_a_set(tmp_path):
    a = tmp_path / "a.jpg"
    b = tmp_path / "copy_of_a.jpg"
    shutil.copyfile(PHOTOS / FIRST_24[0], a)
    shutil.copyfile(PHOTOS / FIRST_24[0], b)
    for seed in range(20):
        assert set_of(content_digest(a), FRACTIONS, seed) == \
            set_of(content_digest(b), FRACTIONS, seed)


def test_the_shipped_photographs_split_the_same_everywhere():
    """The split of testdata/photos is pinned: the same sets on every machine (the
    documented example and walkthrough report figures on the evaluation set)."""
    files = list_images([PHOTOS])
    assert len(files) == 89
    _, _, sizes = split_files(files, "all", FRACTIONS, 0)
    assert sizes == {"calibration": 27, "selection": 31, "evaluation": 31}
    evaluation, _, _ = split_files(files, "evaluation", FRACTIONS, 0)
    assert [p.name for p in evaluation][:5] == [
        "azure_beach_family.jpg", "azure_couple_piggyback.jpg", "azure_dog_on_deck.jpg",
        "azure_fork.jpg", "azure_girl_kitchen.jpg"]


@pytest.mark.parametrize(("extra", "attr", "words"), [
    ("split_fractions = [0.5, 0.5, 0.5]", "split_fractions", "must add up to 1"),
    ("split_fractions = [0.5, 0.5]", "split_fractions", "give 3 fractions"),
    ("split_fractions = [1.0, 0.0, 0.0]", "split", "set of these 3 images is empty"),
])
def test_a_bad_split_is_one_line_naming_file_target_and_attribute(qbuild_workspace, extra,
                                                                  attr, words):
    ws = qbuild_workspace
    _photos(ws, FIRST_24[:3])
    ws.write("d/BUILD.toml", BUILD.format(extra=extra))
    r = ws.build("//d:photos.eval")
    assert not r.ok
    assert r.error.count("\n") == 0, r.error
    assert "d/BUILD.toml" in r.error and "//d:photos.eval" in r.error, r.error
    assert f"attribute '{attr}'" in r.error and words in r.error, r.error


SEARCH = """
[mobilenet]
rule = "onnx_model"
src = "mobilenet.onnx"

[photos]
rule = "image_dataset"
images = ["photos"]
input = "input_1:0"
size = [128, 128]
scale = 0.00784313725490196
mean = [1.0]
split = "{calibration}"
variants = {{ select = {{ split = "selection" }} }}

[aq]
rule = "auto_quantize"
model = ":mobilenet"
calibration_data = ":photos"
evaluation_data = ":photos.select"
task = "classification"
bar = {{ max_top1_drop = 0.5 }}
steps = ["per_channel"]
latency_runs = 0
"""


def test_a_search_refuses_a_selection_set_that_shares_calibration_images(qbuild_workspace):
    ws = qbuild_workspace
    ws.copy(MOBILENET, "d/mobilenet.onnx")
    _photos(ws, FIRST_24[:12])
    # calibrating on every image: the selection set's images are among them
    ws.write("d/BUILD.toml", SEARCH.format(calibration="all"))
    for keep_going in (False, True):
        r = ws.build("//d:aq", keep_going=keep_going)
        assert not r.ok
        # one line naming the file, the search and its attribute, from the one target
        # that failed: the check every trial's calibration data goes through
        assert list(r.failed) == ["//d:aq.calibration_data"], r.failed
        line = r.failed["//d:aq.calibration_data"]
        assert line.count("\n") == 0, line
        assert line.startswith("d/BUILD.toml, target //d:aq, attribute 'evaluation_data': "), \
            line
        assert "shares" in line and "image(s) with calibration_data" in line, line
        # refused first: nothing calibrated, quantized or evaluated (a failed target is
        # not among those that ran)
        assert not [t for t in r.ran if t.startswith("//d:aq")], r.ran
        assert "//d:aq" in r.skipped, r.skipped
    # the calibration split: disjoint, the search runs
    ws.write("d/BUILD.toml", SEARCH.format(calibration="calibration"))
    r = ws.build("//d:aq")
    assert r.ok, r.error


def test_every_shipped_photograph_is_attributed_in_notice():
    import re

    notice = (ROOT / "NOTICE").read_text(encoding="utf-8")
    section = notice[notice.index("\nPhotographs\n"):]
    named = set(re.findall(r"^    (\S+\.(?:jpg|png)) \(", section, re.M))
    shipped = {p.name for p in PHOTOS.iterdir() if p.suffix in (".jpg", ".png")}
    assert named == shipped
    # every source named with a licence the project may redistribute
    for line in re.findall(r"^- \S+ @ [0-9a-f]{12}\. (.+)\.$", section, re.M):
        assert line.split(" repo;")[0] in ("MIT", "Apache-2.0", "BSD-3-Clause",
                                            "MIT OR Apache-2.0"), line
