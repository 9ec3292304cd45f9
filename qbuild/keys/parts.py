"""Action keys: the digest of everything that can change an action's outputs.

The components are kept (``qbuild explain`` diffs them) and hashed as canonical JSON:
the target's label (rules see it, and their outputs live under a folder named after it),
rule kind and version, the providing distribution and its version, qbuild's version, the
digests of the code units implementing the rule (``_code``), every attribute after
defaults, the content digests and executable bits of all inputs (sources and dependency
outputs, by workspace-relative path, and each dependency's declared output order), the
dependencies' info and providers, and the environment facts the rule declares (per rule and per
target). No absolute path enters a key, so moved or copied workspaces and caches hit.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from ..analysis.graph import Target
from ..core import versions
from ..core.generation import GENERATION
from ..core.keyhash import key_hash
from ..core.records import ActionResult, KeyParts
from ..store.gate import Refused, check_parts
from .environ import watched

_env_cache: dict[type, dict[str, str]] = {}
_env_generation = [GENERATION[0]]  # the generation _env_cache was filled in


def rule_env(target: Target) -> dict[str, str]:
    """The facts a rule declares for all its targets (``env()``, machine facts when it is
    machine-dependent), asked once per fact generation (one build, one worker request)
    with the variables they read noted."""
    cls = type(target.rule)
    if _env_generation[0] != GENERATION[0]:  # a new build or worker request
        _env_cache.clear()
        _env_generation[0] = GENERATION[0]
    env = _env_cache.get(cls)
    if env is None:
        declared = watched(target.rule.env) or {}  # type: ignore[union-attr]
        env = {str(k): str(v) for k, v in declared.items()}
        if getattr(cls, "machine_dependent", False):
            from .machine import machine_facts

            env.update(machine_facts())
        _env_cache[cls] = env
    return env


def target_env(target: Target) -> dict[str, str]:
    """The rule's class-wide facts plus the facts of this target's attributes."""
    env = dict(rule_env(target))
    rule: Any = target.rule
    extra = watched(rule.target_env, target.attrs) or {}
    env.update({str(k): str(v) for k, v in extra.items()})
    return env


def components(
    target: Target,
    sources: dict[str, str],
    deps: Mapping[str, ActionResult],
    code: dict[str, str],
    executable: list[str],
    hooks: Mapping[str, list[tuple[str, str]]] | None = None,
) -> KeyParts:
    """The key's parts. ``deps`` maps label -> its result; ``code`` unit -> digest;
    ``executable`` the executable sources; ``hooks`` the plugins implementing each hook
    the rule calls (name -> [(module, distribution and version)])."""
    entry = target.entry
    assert entry is not None
    parts: KeyParts = {
        "label": str(target.label),
        "rule": entry.kind,
        "rule_version": entry.cls.version,
        "plugin": entry.dist,
        "plugin_version": entry.dist_version,
        "qbuild_version": versions.__version__,
        "code": code,
        "attrs": target.attrs,
        "outputs": target.outputs,
        "sources": sources,
        "executable_sources": sorted(executable),
        "deps": {label: dep_part(dep) for label, dep in deps.items()},
        "env": target_env(target),
    }
    if hooks:  # only rules that call hooks have the part (other keys stay as they were)
        parts["hooks"] = {name: [list(item) for item in found]
                          for name, found in hooks.items()}
    return parts


def dep_part(dep: ActionResult) -> dict[str, Any]:
    """What a dependency's result contributes to a key: its files' digests, executable
    bits, declared outputs, info and providers. Computed once per result (results are
    frozen; a target with 5,000 dependents is asked 5,000 times): callers only
    serialise or compare it, never change it."""
    part = dep.__dict__.get("_dep_part")
    if part is None:
        part = _dep_part(dep)
        object.__setattr__(dep, "_dep_part", part)
    return part


def _dep_part(dep: ActionResult) -> dict[str, Any]:
    part: dict[str, Any] = {
        "outputs": dep.digests(),
        "executable": sorted(e.path for e in dep.outputs if e.executable),
        "declared": list(dep.declared),
        "info": dep.info,
    }
    if dep.providers:  # absent for v1 dependencies: their keys stay as they were
        part["providers"] = dep.providers
    if dep.failed is not None:  # a tolerated failure: its reason is what the dependent saw
        part["failed"] = dep.failed
    return part


# Made once: ``json.dumps`` with any option builds a new encoder per call, which costs
# as much as encoding a key's parts.
sorted_json = json.JSONEncoder(sort_keys=True).encode
"""``json.dumps(value, sort_keys=True)``"""

target_key = key_hash
"""A target's key from its parts: ``core.keyhash.key_hash``, the one hash every key
(and the store's gate, checking one) uses."""


DAMAGED = "cannot compare with the last build: its stored key components are damaged"
"""What ``diff`` says (followed by the reason) of components it cannot read."""


def diff(old: Any, new: dict[str, Any],
         code_files: Callable[[str], dict[str, str] | None] | None = None) -> list[str]:
    """Human-readable differences between two sets of key components. ``code_files``
    maps a code unit's digest to its files' digests (to name the file that changed).

    ``old`` is what a store read back, so it is checked first (``store.gate
    .check_parts``): damaged components are one line saying so, never a crash."""
    if old is None:
        return ["never built before (no record of an earlier build)"]
    try:
        return _diff(check_parts(old), new, _checked_files(code_files))
    except Refused as exc:
        return [f"{DAMAGED} ({exc})"]
    except (TypeError, KeyError, AttributeError, ValueError, RecursionError) as exc:
        # (check_parts looks at every type diff reads; this is a last net)
        return [f"{DAMAGED} ({type(exc).__name__})"]


def _checked_files(code_files: Callable[[str], dict[str, str] | None] | None
                   ) -> Callable[[str], dict[str, str] | None] | None:
    """``code_files`` answering None for a stored record that is not a table of
    strings (a damaged one names no file: the unit is reported as changed)."""
    if code_files is None:
        return None
    read = code_files

    def checked(digest: str) -> dict[str, str] | None:
        try:
            files = read(digest)
        except (TypeError, ValueError):  # (a record that is not JSON)
            return None
        if not isinstance(files, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
            return None
        return files

    return checked


def _diff(old: KeyParts, new: dict[str, Any],
          code_files: Callable[[str], dict[str, str] | None] | None) -> list[str]:
    lines: list[str] = []
    if old.get("label", new["label"]) != new["label"]:
        lines.append(f"label: {old.get('label')} -> {new['label']}")
    if old.get("qbuild_version") != new["qbuild_version"]:
        lines.append(f"qbuild: {old.get('qbuild_version')} -> {new['qbuild_version']}")
    lines += _diff_code(old.get("code", {}), new["code"], code_files)
    if old.get("rule") != new["rule"] or old.get("rule_version") != new["rule_version"]:
        lines.append(f"rule: {old.get('rule')} v{old.get('rule_version')} -> "
                     f"{new['rule']} v{new['rule_version']}")
    if old.get("plugin") != new["plugin"] or old.get("plugin_version") != new["plugin_version"]:
        lines.append(f"plugin: {old.get('plugin')} {old.get('plugin_version')} -> "
                     f"{new['plugin']} {new['plugin_version']}")
    old_attrs, new_attrs = old.get("attrs", {}), new["attrs"]
    for name in sorted(set(old_attrs) | set(new_attrs)):
        if old_attrs.get(name, "<absent>") != new_attrs.get(name, "<absent>"):
            lines.append(f"attribute '{name}': {json.dumps(old_attrs.get(name))} -> "
                         f"{json.dumps(new_attrs.get(name))}")
    if old.get("outputs") != new["outputs"]:
        lines.append(f"declared outputs: {old.get('outputs')} -> {new['outputs']}")
    lines += _diff_files("input", old.get("sources", {}), new["sources"])
    if old.get("executable_sources", []) != new["executable_sources"]:
        lines.append(f"executable inputs: {old.get('executable_sources', [])} -> "
                     f"{new['executable_sources']}")
    old_deps, new_deps = old.get("deps", {}), new["deps"]
    for label in sorted(set(old_deps) | set(new_deps)):
        if label not in old_deps:
            lines.append(f"new dependency {label}")
        elif label not in new_deps:
            lines.append(f"dependency {label} removed")
        else:
            lines += _diff_files(f"output of {label}:", old_deps[label]["outputs"],
                                 new_deps[label]["outputs"])
            if old_deps[label]["info"] != new_deps[label]["info"]:
                lines.append(f"info of {label} changed")
            if old_deps[label].get("providers") != new_deps[label].get("providers"):
                lines.append(f"providers of {label} changed")
            for part in ("declared", "executable"):
                if old_deps[label].get(part) != new_deps[label].get(part):
                    lines.append(f"{part} outputs of {label}: {old_deps[label].get(part)} -> "
                                 f"{new_deps[label].get(part)}")
    if old.get("hooks", {}) != new.get("hooks", {}):
        lines.append(f"hook implementations: {json.dumps(old.get('hooks', {}))} -> "
                     f"{json.dumps(new.get('hooks', {}))}")
    old_env, new_env = old.get("env", {}), new["env"]
    for name in sorted(set(old_env) | set(new_env)):
        if old_env.get(name) != new_env.get(name):
            lines.append(f"environment '{name}': {old_env.get(name)} -> {new_env.get(name)}")
    return lines


def _diff_code(old: dict[str, str], new: dict[str, str],
               code_files: Callable[[str], dict[str, str] | None] | None) -> list[str]:
    lines = []
    for unit in sorted(set(old) | set(new)):
        before, after = old.get(unit), new.get(unit)
        if before == after:
            continue
        old_files = code_files(before) if code_files and before else None
        new_files = code_files(after) if code_files and after else None
        if old_files is None or new_files is None:
            lines.append(f"rule code changed: {unit}")
            continue
        changed = [name for name in sorted(set(old_files) | set(new_files))
                   if old_files.get(name) != new_files.get(name)]
        lines += [f"rule code changed: {name}" for name in changed] or [
            f"rule code changed: {unit}"]
    return lines


def _diff_files(what: str, old: dict[str, str], new: dict[str, str]) -> list[str]:
    lines = []
    for path in sorted(set(old) | set(new)):
        before, after = old.get(path), new.get(path)
        if before == after:
            continue
        if before is None:
            lines.append(f"{what} {path} added ({(after or '')[:12]})")
        elif after is None:
            lines.append(f"{what} {path} removed (was {before[:12]})")
        else:
            lines.append(f"{what} {path} changed: {before[:12]} -> {after[:12]}")
    return lines
