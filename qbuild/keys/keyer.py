"""The ``Keyer``: every part of an action key, computed in one place.

A target's key is made from its attributes, the content digests and executable bits of
its inputs, its dependencies' results, the digests of the code that runs it (the rule,
its providers, its action functions, the hook plugins it calls), and the environment
facts the rule declares (machine and toolchain facts included: ``parts``). The keyer
also makes the ``TargetActions`` record the executor runs, and keeps the code records
``qbuild explain`` names changed files from. The build, the commands that show keys
(``explain``, ``aquery``) and the shortcuts all key through one ``Keyer``.
"""

from __future__ import annotations

import dataclasses
import os
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..analysis.graph import Target
from ..analysis.plugins import Registry
from ..api.providers import provider_name
from ..api.rule import RUN_RULE
from ..core import versions
from ..core.labels import Label
from ..core.protocols import Store
from ..core.records import ActionResult, KeyParts, TargetActions
from ..store.digests import SourceDigests
from .action_keys import declared_action_key, declared_action_parts
from .code import CodeDigests
from .parts import components, target_env, target_key


class Keyer:
    """Keys for the targets of one workspace, with the code and source digests they use.

    ``store`` is asked for lazily (a callable), so commands that never key (query,
    outputs) never open the cache."""

    def __init__(self, root: Path, registry: Registry, digests: SourceDigests,
                 store: Callable[[], Store]) -> None:
        self.registry = registry
        self.digests = digests
        self._store = store
        self._code: CodeDigests | None = None
        self._code_memo: dict[tuple[type | None, tuple[str, ...]], dict[str, str]] = {}
        self._attr_type_memo: dict[type, dict[str, str]] = {}
        self._rule_memo: dict[str, tuple[Any, Any, Any, dict[str, Any]]] = {}
        self._root_text = str(root) + os.sep

    @property
    def code(self) -> CodeDigests:
        """Digests of the code units rules run (made on first use)."""
        if self._code is None:
            dists = sorted({e.dist for e in self.registry.entries.values()})
            self._code = CodeDigests(self.digests, dists)
        return self._code

    @property
    def code_used(self) -> bool:
        """Were code digests taken (by keying an action)?"""
        return self._code is not None

    def code_parts(self, target: Target) -> dict[str, str]:
        """Digest of every code unit ``target``'s action runs (see ``_code``): the rule's,
        its providers' and, for a v2 rule, its action functions'."""
        assert target.rule is not None
        refs = [*(target.rule.code(target.attrs) or []), *_provider_refs(target)]
        refs += [spec.function for spec in target.actions]
        return self._code_digests(type(target.rule), refs)

    def action_code(self, target: Target, function: str) -> dict[str, str]:
        """Code units of one declared action: the engine, its function's package, the
        providers involved and what the rule's ``code()`` names, not the rule class."""
        assert target.rule is not None
        refs = [*(target.rule.code(target.attrs) or []), *_provider_refs(target), function]
        # A ``run`` rule's action runs the rule class itself: its code is the class's.
        return self._code_digests(type(target.rule) if function == RUN_RULE else None, refs)

    def _code_digests(self, rule_cls: type | None, refs: list[str]) -> dict[str, str]:
        # Memoised for this session: every unit is digested once per session anyway.
        memo_key = (rule_cls, tuple(refs))
        found = self._code_memo.get(memo_key)
        if found is None:
            units = self.code.units_for(rule_cls, refs, self.registry.pm)
            found = self._code_memo[memo_key] = {
                unit: self.code.unit(unit)[0] for unit in units}
        return dict(found)

    def code_files(self, digest: str) -> dict[str, str] | None:
        """The per-file digests of a code unit by its digest (for explanations)."""
        files = self.code.files_of(digest)
        return files if files is not None else self._store().get_code(digest)

    def save_code(self, parts: KeyParts) -> None:
        for unit in parts["code"]:
            digest, files = self.code.unit(unit)
            self._store().put_code(digest, files)

    def key_for(self, target: Target, results: Mapping[Label, ActionResult]
                ) -> tuple[KeyParts, str, TargetActions]:
        """Key components, key and runnable action of ``target`` given its deps' results."""
        parts, key, action = self.keyed(target, results)
        assert parts is not None
        return parts, key, action

    def keyed(self, target: Target, results: Mapping[Label, ActionResult],
              with_parts: bool = True) -> tuple[KeyParts | None, str, TargetActions]:
        """``key_for``; without ``with_parts``, the components are left out (None) when
        the key does not need them (a target whose one action makes every output is
        keyed by that action's own parts): a lookup that hits never needs them."""
        root = self._root_text
        digests = self.digests
        sources = {rel: digests.digest(root + rel) for rel in target.sources}
        executable = [rel for rel in target.sources
                      if digests.mode(root + rel) & stat.S_IXUSR]
        deps = {str(dep): results[dep] for dep in target.deps}
        hooks = self.registry.hook_plugins(target)
        actions = target.actions
        single = len(actions) == 1 and list(actions[0].outputs) == target.outputs
        parts = None
        if with_parts or not single:
            parts = components(target, {rel: d for rel, (d, _) in sources.items()}, deps,
                               self.code_parts(target), executable, hooks)
        # (A single action's own key replaces the target's below: no need to hash it.)
        key = "" if single or parts is None else target_key(parts)
        entry, rule = target.entry, target.rule
        assert entry is not None and rule is not None
        constant = self._rule_constants(entry, rule)
        # The record's fields, set as TargetActions's generated __init__ would (a frozen class
        # sets each through object.__setattr__: 25 calls per target): every field, the
        # defaults first. The record is ours alone until it is returned.
        fields: dict[str, Any] = {**_ACTION_DEFAULTS, "accelerators": {}, "action_base": {}}
        fields.update(
            label=target.label, build_file=target.build_file, rule_ref=constant["ref"],
            heavy=constant["heavy"], attrs=target.attrs, attr_types=constant["attr_types"],
            sources=sources, deps=deps, outputs=tuple(target.outputs), key=key,
            reproducible=rule.is_reproducible(target.attrs),
            hooks={name: tuple(module for module, _ in found)
                   for name, found in hooks.items()} if hooks else {})
        if actions:
            env = parts["env"] if parts is not None else target_env(target)
            action_base = dict(constant["action_base"])
            action_base["env"] = env
            action_base["hooks"] = {name: [list(item) for item in found]
                                  for name, found in hooks.items()} if hooks else {}
            fields.update(
                actions=tuple(actions), executable=tuple(executable), action_base=action_base,
                action_code=tuple([self.action_code(target, spec.function) for spec in actions]))
        action: TargetActions = _new_action(TargetActions)
        action.__dict__.update(fields)
        if single:
            # One action making every output: the target's key is the action's own
            # (label-free) key, so it costs one lookup and one entry, as a v1 target.
            # (Its parts read the record's fields only: the key is set in it once made.)
            step_parts = declared_action_parts(action, 0, {})
            key = declared_action_key(step_parts)
            action.__dict__.update(key=key, keyed_by_action=True)
            if parts is not None:
                # What the key is made of, kept beside the target's parts (which
                # ``qbuild explain`` diffs): a store checks an entry against them.
                parts["key_parts"] = step_parts
        return parts, key, action

    def _rule_constants(self, entry: Any, rule: Any) -> dict[str, Any]:
        """What every target of one rule puts in its action record and step keys alike
        (memoised per entry while the rule's ``provides`` is the very object it was)."""
        known = self._rule_memo.get(entry.kind)
        if known is not None and known[0] is entry and known[1] is rule.provides and \
                known[2] == (rule.heavy, entry.cls.version):
            return known[3]
        constant = {
            "ref": entry.ref, "heavy": bool(rule.heavy), "attr_types": self._attr_types(rule),
            "action_base": {
                "rule": entry.kind, "rule_version": entry.cls.version, "plugin": entry.dist,
                "plugin_version": entry.dist_version, "qbuild_version": versions.__version__,
                "provides": sorted(provider_name(p) for p in rule.provides)}}
        self._rule_memo[entry.kind] = (entry, rule.provides, (rule.heavy, entry.cls.version),
                                       constant)
        return constant

    def parts_of(self, target: Target, action: TargetActions) -> KeyParts:
        """The components of a target keyed by ``keyed(..., with_parts=False)``."""
        parts = components(target, {rel: d for rel, (d, _) in action.sources.items()},
                           action.deps, self.code_parts(target), list(action.executable),
                           self.registry.hook_plugins(target))
        if action.keyed_by_action:
            parts["key_parts"] = declared_action_parts(action, 0, {})
        return parts

    def _attr_types(self, rule: Any) -> dict[str, str]:
        cls = type(rule)
        types = self._attr_type_memo.get(cls)
        if types is None:
            types = self._attr_type_memo[cls] = {
                name: schema.type for name, schema in rule.attrs.items()}
        return types


_new_action = object.__new__
# Every field of a TargetActions with its default (the record is made field by field).
_ACTION_DEFAULTS: dict[str, Any] = {
    f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    for f in dataclasses.fields(TargetActions)
    if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING}

# rule class -> (its provides, its attrs, the modules of their providers)
_provider_memo: dict[type, tuple[Any, Any, list[str]]] = {}


def _provider_refs(target: Target) -> list[str]:
    """Modules of the providers a target gives and asks its dependencies for (declared
    by the rule: memoised per class while the rule's ``provides`` and ``attrs`` are the
    very objects they were)."""
    rule = target.rule
    assert rule is not None
    known = _provider_memo.get(type(rule))
    if known is not None and known[0] is rule.provides and known[1] is rule.attrs:
        return list(known[2])
    classes = [*rule.provides, *(p for schema in rule.attrs.values() for p in schema.providers)]
    refs = sorted({provider.__module__ for provider in classes})
    _provider_memo[type(rule)] = (rule.provides, rule.attrs, refs)
    return list(refs)
