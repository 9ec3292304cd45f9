"""Every rule the built-in plugins register is a rule API v2 rule: it declares its
actions in ``analyze`` and none overrides the v1 ``run`` (which stays supported for
third-party plugins such as examples/plugin-wordcount)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from qbuild import Rule

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def _builtin_rules() -> list[type[Rule]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    rules = []
    for name, target in project["entry-points"]["qbuild"].items():
        module = importlib.import_module(target)
        hook = getattr(module, "qbuild_rule_types", None)
        if hook is not None:
            rules += [(name, cls) for cls in hook()]
    return rules


def test_every_builtin_rule_declares_actions_and_none_uses_run():
    rules = _builtin_rules()
    kinds = {cls.kind for _, cls in rules}
    # the plugins are all there (a renamed module would silently test nothing)
    assert {"onnx_model", "quantize", "evaluate", "auto_quantize", "adaround",
            "lower_integer", "command"} <= kinds
    v1 = [f"{plugin}: {cls.kind}" for plugin, cls in rules
          if not cls.is_v2() or cls.run is not Rule.run]
    assert v1 == []
