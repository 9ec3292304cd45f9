"""Every TOML example in README.md and docs/*.md is checked against the real engine, so
the documentation cannot drift from the code.

A ```toml block is, by default, a complete BUILD.toml: it is analysed in a workspace
where its source files exist (as placeholders: analysis needs them to exist, not their
content). An HTML comment on the line before the block says otherwise:

    <!-- docs-test: build -->    complete and cheap (no big data): also build it
    <!-- docs-test: partial -->  targets that use labels defined elsewhere: every
                                 target's rule and attributes are still checked
    <!-- docs-test: toml -->     a fragment (sub-tables, pyproject.toml): parsed only

A block with a ``[settings]`` table is a qbuild.toml and is loaded as one.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from qbuild._errors import QbuildError
from qbuild._loader import MATRIX_KIND, PackageLoader
from qbuild._plugins import load_registry
from qbuild._rule import check_attrs
from qbuild._toml import tomllib
from qbuild._workspace import load_workspace

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_BLOCK = re.compile(r"(?:<!--\s*docs-test:\s*(\w+)\s*-->[ \t]*\n)?[ \t]*```toml\n(.*?)```",
                    re.S)
_GLOB = re.compile(r"[*?]")


def _snippets() -> list[tuple[str, str, str]]:
    found = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for match in _BLOCK.finditer(text):
            line = text.count("\n", 0, match.start(2))
            found.append((f"{doc.name}:{line}", match.group(1) or "analyse", match.group(2)))
    return found


SNIPPETS = _snippets()


def test_the_docs_have_examples_and_known_markers():
    assert len(SNIPPETS) >= 10
    assert {mode for _, mode, _ in SNIPPETS} <= {"analyse", "build", "partial", "toml"}


@pytest.fixture(scope="module")
def registry():
    return load_registry()


def _placeholders(registry, ws, text: str) -> None:
    """Create every source file the snippet names, so analysis can find it."""
    for table in tomllib.loads(text).values():
        if not isinstance(table, dict) or "rule" not in table:
            continue
        entry = registry.get(table["rule"])
        assert entry is not None, f"unknown rule {table['rule']!r}"
        for name, schema in entry.cls.attrs.items():
            if schema.type not in ("file", "files") or name not in table:
                continue
            values = table[name] if isinstance(table[name], list) else [table[name]]
            for value in values:
                if not isinstance(value, str) or value.startswith((":", "//")):
                    continue
                rel = _GLOB.sub("x", value)
                if schema.folder_suffixes is not None and not Path(rel).suffix:
                    ws.write(f"pkg/{rel}/x{(schema.folder_suffixes or ('.txt',))[0]}", "x")
                elif not ws.path(f"pkg/{rel}").exists():
                    ws.write(f"pkg/{rel}", "placeholder")


def _check_schemas(registry, ws, text: str) -> None:
    ws.write("pkg/BUILD.toml", text)
    specs = PackageLoader(load_workspace(ws.root)).load("pkg")
    assert specs, "no targets"
    for spec in specs.values():
        if spec.kind == MATRIX_KIND:
            continue
        entry = registry.get(spec.kind)
        assert entry is not None, f"{spec.label}: unknown rule {spec.kind!r}"
        rule = entry.cls()
        raw = {k: v for k, v in spec.raw.items() if k in rule.attrs or k not in spec.matrix_keys}
        try:
            check_attrs(rule, raw)
        except QbuildError as exc:
            raise AssertionError(f"{spec.label}: {exc}") from None


@pytest.mark.parametrize(("where", "mode", "text"), SNIPPETS, ids=[s[0] for s in SNIPPETS])
def test_doc_snippet(where, mode, text, registry, qbuild_workspace):
    ws = qbuild_workspace
    data = tomllib.loads(text)  # every snippet is valid TOML
    if mode == "toml":
        return
    if "settings" in data:
        ws.write("qbuild.toml", text)
        load_workspace(ws.root)
        return
    if mode == "partial":
        _check_schemas(registry, ws, text)
        return
    _placeholders(registry, ws, text)
    ws.write("pkg/BUILD.toml", text)
    if mode == "build":
        result = ws.cli("build", "//pkg:all")
        assert result.code == 0, f"{where}: {result.stderr}"
    else:
        result = ws.cli("query", "deps(//pkg:all)")
        assert result.code == 0, f"{where}: {result.stderr}"
