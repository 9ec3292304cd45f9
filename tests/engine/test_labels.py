"""Labels and patterns."""

import pytest

from qbuild import ConfigError
from qbuild.core.labels import Label, Pattern, parse_label, parse_pattern


@pytest.mark.parametrize(("text", "package", "expected"), [
    ("//models:yolo", None, Label("models", "yolo")),
    ("//models/sub:x@a=1,b=true", None, Label("models/sub", "x@a=1,b=true")),
    ("//models/yolo", None, Label("models/yolo", "yolo")),
    (":calib", "models", Label("models", "calib")),
    ("//:top", None, Label("", "top")),
])
def test_parse_label(text, package, expected):
    assert parse_label(text, package) == expected


@pytest.mark.parametrize("text", ["models:x", "//a::b", "//a/../b:c", "/abs:x", "//a:",
                                  "//a:b/c", ":x y", "//a//b:c"])
def test_malformed_labels_are_rejected(text):
    with pytest.raises(ConfigError):
        parse_label(text, "pkg")


@pytest.mark.parametrize(("text", "expected"), [
    ("//...", Pattern("", None, True)),
    ("//models/...", Pattern("models", None, True)),
    ("//models:all", Pattern("models", None, False)),
    ("//models:x", Pattern("models", "x", False)),
])
def test_parse_pattern(text, expected):
    assert parse_pattern(text) == expected
