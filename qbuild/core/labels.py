"""Labels (`//pkg/sub:name`) and target patterns (`//pkg/...`, `//...`, `//pkg:all`).

A label names a target: a package (a workspace-relative directory holding a
``BUILD.toml``) and a target name inside it. Labels never hold absolute paths and can
never escape the workspace.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .errors import ConfigError

_PACKAGE_SEGMENT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*$")
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+=,@-]*$")


@dataclass(frozen=True, order=True)
class Label:
    """A target's identity: ``package`` ("" for the root) and ``name``."""

    package: str
    name: str
    # A label keys every table of a build (plan, results, graph: some fifty lookups
    # per target) and is written out a dozen times per target, so its hash and text
    # are made once, with it (not fields compared, shown or pickled: another process
    # hashes strings with another seed).
    _hash: int = field(init=False, repr=False, compare=False)
    _text: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.package, self.name)))
        object.__setattr__(self, "_text", f"//{self.package}:{self.name}")

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple[type[Label], tuple[str, str]]:
        return Label, (self.package, self.name)

    def __str__(self) -> str:
        return self._text


OUT_PREFIX = "qbuild-out"  # the output folder's name inside every action's sandbox


def output_folder(label: str | Label) -> str:
    """The folder of a target's outputs, relative to the output directory (``qbuild-out``
    in the workspace, and in every action's sandbox): ``//pkg/sub:name`` ->
    ``pkg/sub/@name``, ``//:name`` -> ``@name``.

    Injective and prefix-free: package segments never start with ``@``, target names hold
    no ``/``, so no target's folder is, or contains, another target's folder.
    """
    text = str(label)
    package, name = text[2:].split(":", 1)
    return f"{package}/@{name}" if package else f"@{name}"


def _check_package(package: str, text: str) -> str:
    if package == "":
        return package
    for segment in package.split("/"):
        if segment in ("", ".", ".."):
            if segment == "..":
                raise ConfigError(f"label '{text}' escapes the workspace ('..' is not allowed)")
            raise ConfigError(f"malformed label '{text}': empty or '.' package segment")
        if not _PACKAGE_SEGMENT.fullmatch(segment):
            raise ConfigError(f"malformed label '{text[:80]}': bad package segment "
                              f"'{segment[:40]}'")
        if len(segment.encode("utf-8")) > _MAX_NAME_BYTES:
            raise ConfigError(f"malformed label '{text[:80]}...': a package folder name is "
                              f"over {_MAX_NAME_BYTES} bytes")
    return package


_MAX_NAME_BYTES = 255  # one path component: target names become folder names


def _check_name(name: str, text: str) -> str:
    if not _NAME.fullmatch(name) or ".." in name.split("/"):
        raise ConfigError(
            f"malformed label '{text[:80]}': target names use letters, digits and _ . + = , @ -"
        )
    if len(name.encode("utf-8")) > _MAX_NAME_BYTES:
        raise ConfigError(f"target name '{name[:40]}...' is {len(name.encode())} bytes long; "
                          f"the limit is {_MAX_NAME_BYTES} (it names a folder)")
    return name


def is_label_text(text: str) -> bool:
    """True if ``text`` is written as a label (``//…`` or ``:name``) rather than a path."""
    return text.startswith("//") or text.startswith(":")


def parse_label(text: str, current_package: str | None = None) -> Label:
    """Parse ``//pkg:name``, ``//pkg`` (= ``//pkg:last``), or ``:name`` (same package).

    Raises:
        ConfigError: malformed, escaping the workspace, or relative without a package.
    """
    if not isinstance(text, str) or not text:
        raise ConfigError(f"malformed label {text!r}")
    if text.startswith(":"):
        if current_package is None:
            raise ConfigError(f"relative label '{text}' needs a package: write //pkg{text}")
        return Label(current_package, _check_name(text[1:], text))
    if text.startswith("/") and not text.startswith("//"):
        raise ConfigError(f"label '{text}' is an absolute path; labels start with //")
    if not text.startswith("//"):
        raise ConfigError(f"malformed label '{text}': write //pkg:name or :name")
    body = text[2:]
    if ":" in body:
        package, name = body.split(":", 1)
    else:
        package, name = body, body.rsplit("/", 1)[-1]
        if not name:
            raise ConfigError(f"malformed label '{text}': no target name")
    return Label(_check_package(package.rstrip("/") if package != "" else "", text),
                 _check_name(name, text))


@dataclass(frozen=True)
class Pattern:
    """A target pattern: one label, all targets of a package, or a package tree."""

    package: str
    name: str | None  # None: every target in the package(s)
    recursive: bool

    def __str__(self) -> str:
        if self.recursive:
            return f"//{self.package + '/' if self.package else ''}..."
        if self.name is None:
            return f"//{self.package}:all"
        return str(Label(self.package, self.name))


def parse_pattern(text: str, current_package: str | None = None) -> Pattern:
    """Parse ``//pkg:name``, ``:name``, ``//pkg``, ``//pkg:all``, ``//pkg/...`` or ``//...``."""
    if text.startswith("//") and (text == "//..." or text.endswith("/...")):
        package = text[2:-3].rstrip("/")
        return Pattern(_check_package(package, text), None, True)
    if text.endswith(":all") or text.endswith(":*"):
        in_package = text[2:].rsplit(":", 1)[0] if text.startswith("//") else current_package
        if in_package is None:
            raise ConfigError(f"pattern '{text}' needs a package")
        return Pattern(_check_package(in_package, text), None, False)
    label = parse_label(text, current_package)
    return Pattern(label.package, label.name, False)
