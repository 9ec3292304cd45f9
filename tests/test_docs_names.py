"""What the documentation names must exist: the files it quotes and links to, and the node
and tensor names it quotes from a model.

* **Files.** Every ``path/to/file.ext`` a page quotes in backticks (outside code blocks) and
  every relative link target must exist in the repository: relative to the repository's
  root, to the page's folder, to ``plugins/``, or to one plugin package (pages name
  modules inside a plugin as ``accuracy/detection.py``). Generated paths (under
  ``qbuild-out/``, ``.qbuild/``, ``~`` or ``/``) and the team's ``../shared/`` folder
  (beside a checkout, not in a user's clone) are not checked.
* **Model names.** A section (a heading and its text) that talks about one of the
  repository's models (it names the model or its file) may quote node names
  (``Mul_75``: an ONNX operator type, ``_`` and a number), tensors in selectors
  (``upto:729``, ``after:1213``), numeric tensor names (``1177``) and ``name:0`` tensor
  names (``input_1:0``). Each must exist in that model, as shipped or after
  onnxruntime's quantization pre-processing (``quant_preprocess``), which renames some
  nodes. Placeholders (``upto:TENSOR``, ``after:<tensor>``) are not names.
* **Region sizes.** A sentence in such a section that gives a region as ``upto:T`` or
  "up to `NODE`" and says how many nodes it holds ("37 nodes") must give the count of
  that selector on the pre-processed model, which is what ``quantize`` resolves it on
  (a sentence naming onnxruntime 1.31 speaks of that release's pre-processing and is
  not checked). The YOLO example once said "the first 42 nodes, up to `Mul_75`" after
  onnxruntime 1.32 had made it 37.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md")),
         *sorted(ROOT.glob("examples/*/README.md"))]
PLUGIN_PACKAGES = sorted(p for p in (ROOT / "plugins").iterdir() if (p / "__init__.py").exists())

_FENCE = re.compile(r"^[ \t]*```.*?^[ \t]*```", re.S | re.M)
_CODE = re.compile(r"`([^`\n]+)`")
_PATH = re.compile(r"^[\w.-]+(?:/[\w.-]+)+\.(?:py|toml|md|onnx|json|txt|sh|lock|cfg|ini|yml|yaml)$")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
# (``../shared/`` is the team's read-only folder beside a checkout: not in a user's clone)
_GENERATED = ("qbuild-out/", ".qbuild/", "~", "/", "../shared/")

# The repository's models a section may talk about: how pages name them, and the file.
MODELS = {
    "yolox": (re.compile(r"YOLOX|yolox_nano"), ROOT / "examples/yolo/yolox_nano.onnx"),
    "mobilenet": (re.compile(r"MobileNet|mobilenet_v2"),
                  ROOT / "testdata/models/mobilenet_v2_128_0.5.onnx"),
}
_NODE = re.compile(r"^([A-Z][A-Za-z]+)_\d+$")
_SELECTOR = re.compile(r"^(?:upto|after):(\S+)$")
_NUMBER = re.compile(r"^\d{3,}$")
_COLON = re.compile(r"^(?!(?:upto|after|first|last|op|name):)\w+:\d+$")


def _prose(text: str) -> str:
    """The page without its fenced code blocks."""
    return _FENCE.sub("", text)


def _page_id(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


# ---------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------

def _made_by_setup(text: str) -> tuple[str, ...]:
    """Top folders a page's ``<!-- docs-test: setup -->`` block makes (the reader's own
    workspace, as in docs/walkthrough.md): paths inside them are the reader's."""
    block = re.search(r"<!--\s*docs-test:\s*setup\s*-->[ \t]*\n```sh\n(.*?)```", text, re.S)
    if not block:
        return ()
    made = re.findall(r"^mkdir -p (.+)$", block.group(1), re.M)
    return tuple(dict.fromkeys(p.split("/")[0] + "/" for line in made for p in line.split()))


def _quoted_paths(page: Path) -> list[str]:
    text = page.read_text(encoding="utf-8")
    prose = _prose(text)
    generated = _GENERATED + _made_by_setup(text)
    paths = [c for c in _CODE.findall(prose) if _PATH.match(c)]
    for target in _LINK.findall(prose):
        if "://" in target or target.startswith(("#", "mailto:")):
            continue
        paths.append(target.split("#")[0])
    return [p for p in dict.fromkeys(paths) if p and not p.startswith(generated)]


def _exists(path: str, page: Path) -> bool:
    bases = [ROOT, page.parent, ROOT / "plugins", *PLUGIN_PACKAGES]
    return any((base / path).exists() for base in bases)


def test_the_path_check_finds_paths():
    # the check would pass on pages it cannot read: make sure it reads them
    assert "docs/accuracy-tools.md" in _quoted_paths(ROOT / "examples/yolo/README.md") or \
        "examples/yolo/BUILD.toml" in _quoted_paths(ROOT / "docs/accuracy-tools.md")
    assert not _exists("plugins/qbuild_dtypes/ort_probe.py", ROOT / "README.md")
    assert _exists("accuracy/detection.py", ROOT / "docs/accuracy-tools.md")


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_every_quoted_path_exists(page):
    missing = [p for p in _quoted_paths(page) if not _exists(p, page)]
    assert not missing, f"{_page_id(page)} names files that do not exist: {missing}"


# ---------------------------------------------------------------------------------------
# Node and tensor names
# ---------------------------------------------------------------------------------------

def _sections(page: Path) -> list[tuple[str, str]]:
    """(heading, prose) of each section of the page."""
    parts = re.split(r"\n(?=#{1,6} )", _prose(page.read_text(encoding="utf-8")))
    return [(part.strip().split("\n")[0].lstrip("# ").strip(), part) for part in parts]


def _quoted_names(prose: str) -> list[str]:
    import onnx

    ops = {schema.name for schema in onnx.defs.get_all_schemas_with_history()}
    names = []
    for code in _CODE.findall(prose):
        node = _NODE.match(code)
        selector = _SELECTOR.match(code)
        if node and node.group(1) in ops:
            names.append(code)
        elif selector:
            tensor = selector.group(1)
            if not (tensor.isupper() or tensor.startswith("<")):  # placeholders
                names.append(tensor)
        elif _NUMBER.match(code) or _COLON.match(code):
            names.append(code)
    return list(dict.fromkeys(names))


def _checked_sections() -> list[tuple[str, list[str], list[str]]]:
    found = []
    for page in PAGES:
        for heading, prose in _sections(page):
            models = [key for key, (pattern, _) in MODELS.items() if pattern.search(prose)]
            names = _quoted_names(prose)
            if models and names:
                found.append((f"{_page_id(page)}: {heading[:60]}", models, names))
    return found


CHECKED = _checked_sections()


def test_the_name_check_sees_the_yolo_example_and_the_walkthrough():
    where = " ".join(section for section, _, _ in CHECKED)
    assert "examples/yolo/README.md" in where
    assert "docs/walkthrough.md" in where
    assert "docs/selectors.md" in where


@pytest.fixture(scope="module")
def model_names(preprocessed):
    """Every node and tensor name of each model, as shipped and pre-processed."""
    import onnx

    def names(model: onnx.ModelProto) -> set[str]:
        graph = model.graph
        found = {n.name for n in graph.node}
        found |= {t for n in graph.node for t in (*n.input, *n.output)}
        found |= {t.name for t in (*graph.input, *graph.output, *graph.initializer)}
        return found

    cache: dict[str, set[str]] = {}

    def get(key: str) -> set[str]:
        if key not in cache:
            cache[key] = (names(onnx.load(str(MODELS[key][1]))) |
                          names(onnx.load(str(preprocessed(key)))))
        return cache[key]

    return get


@pytest.fixture(scope="module")
def preprocessed(tmp_path_factory):
    """The model after onnxruntime's quantization pre-processing (the form
    ``quant_preprocess`` gives the rules), made once per module."""
    made: dict[str, Path] = {}

    def get(key: str) -> Path:
        if key not in made:
            from onnxruntime.quantization.shape_inference import quant_pre_process

            made[key] = tmp_path_factory.mktemp(f"pre-{key}") / "pre.onnx"
            quant_pre_process(str(MODELS[key][1]), str(made[key]))
        return made[key]

    return get


@pytest.mark.parametrize(("section", "models", "names"), CHECKED,
                         ids=[c[0] for c in CHECKED])
def test_quoted_model_names_exist(section, models, names, model_names):
    known = set().union(*(model_names(key) for key in models))
    missing = [name for name in names if name not in known]
    assert not missing, (f"{section} quotes {missing}, which the model it talks about "
                         f"({', '.join(MODELS[k][1].name for k in models)}) does not "
                         "have, as shipped or pre-processed")


_SENTENCE = re.compile(r"(?<=[.;:])\s+|\s+[*-]\s+")  # sentences, clauses and list items
_COUNT = re.compile(r"\b(\d+) nodes\b")
_UPTO_TENSOR = re.compile(r"upto:(\w+)")
_UPTO_NODE = re.compile(r"up to `([A-Z][A-Za-z]+_\d+)`")


def _region_claims() -> list[tuple[str, str, str, str, int]]:
    """(section, model, kind, name, count) for each sentence stating a region's size."""
    claims = []
    for page in PAGES:
        for heading, prose in _sections(page):
            models = [key for key, (pattern, _) in MODELS.items() if pattern.search(prose)]
            if len(models) != 1:
                continue
            for paragraph in prose.split("\n\n"):
                for sentence in _SENTENCE.split(" ".join(paragraph.split())):
                    counts = _COUNT.findall(sentence)
                    if not counts or "1.31" in sentence:
                        continue
                    refs = [("tensor", m) for m in _UPTO_TENSOR.findall(sentence)]
                    refs += [("node", m) for m in _UPTO_NODE.findall(sentence)]
                    for kind, name in refs[:1]:
                        claims.append((f"{_page_id(page)}: {heading[:50]}", models[0], kind,
                                       name, int(counts[0])))
    return claims


CLAIMS = _region_claims()


def test_the_region_check_reads_the_yolo_example():
    assert any(c[0].startswith("examples/yolo/README.md") for c in CLAIMS)
    stale = "The stem (the first 42 nodes, up to `Mul_75`) kept float."
    assert _UPTO_NODE.findall(stale) == ["Mul_75"] and _COUNT.findall(stale) == ["42"]


@pytest.mark.parametrize(("section", "model", "kind", "name", "count"), CLAIMS,
                         ids=[f"{c[0]}: {c[3]}" for c in CLAIMS])
def test_region_sizes_match_the_model(section, model, kind, name, count, preprocessed):
    import onnx
    from qbuild_onnx.quantization.selectors import resolve_nodes

    pre = onnx.load(str(preprocessed(model)))
    tensor = name
    if kind == "node":
        node = next((n for n in pre.graph.node if n.name == name), None)
        assert node is not None, f"{section}: no node {name} in the pre-processed model"
        tensor = node.output[0]
    region = resolve_nodes([f"upto:{tensor}"], pre, "nodes_to_exclude")
    assert len(region) == count, (f"{section} says the region up to {name} holds {count} "
                                  f"nodes; on the pre-processed model it holds {len(region)}")
