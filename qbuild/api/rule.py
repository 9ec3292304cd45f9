"""The rule API: ``Rule`` (what a plugin subclasses), ``Dep`` and ``ActionContext``.

A rule declares its kind, version, typed attributes, outputs and the providers it gives.
A v2 rule overrides ``analyze(ctx)`` and declares one or more actions there (see
``_actions``); a v1 rule overrides ``run(ctx)``, which the default ``analyze`` makes the
target's single action: the engine stages its declared inputs in a private directory and
calls ``run(ctx)``, which reads only what ``ctx`` hands it, writes only
``ctx.output(...)`` paths and returns providers and/or a JSON-serializable dict ("info",
deprecated) that dependents see as ``Dep.info``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, overload

from ..core.errors import ConfigError, RuleError
from .attrs import Attr
from .providers import DefaultInfo, P, Provider, check_provider_class, decode, provider_name

if TYPE_CHECKING:
    from .actions import AnalysisContext, RunContext

D = TypeVar("D")
RESERVED_KEYS = frozenset({"rule", "matrix", "tags"})
_KIND = re.compile(r"^[a-z][a-z0-9_]*$")


class Rule:
    """Base class of every rule. Subclass it and set the class attributes.

    Attributes:
        kind: the name users write as ``rule = "<kind>"``.
        version: bump whenever the rule's outputs could change for the same inputs;
            every cached result of the old version is then ignored.
        doc: help text shown by ``qbuild rules <kind>``.
        heavy: run in a worker process (CPU-heavy work, imports of large libraries).
        reproducible: False if running again may give different bytes (measured
            timings); override ``is_reproducible`` when that depends on attributes.
            A non-reproducible result is still cached; it is only run again when its
            stored outputs are gone, and the new bytes then replace the old.
        cpu: cores one action can use (threads of an onnxruntime session, ...); the
            scheduler grants ``min(cpu, --local_resources cpu)`` as ``ctx.threads`` and
            never runs actions whose grants add up to more than that budget.
        memory: peak memory of one action in MiB (0: negligible); running actions never
            add up to more than ``--local_resources memory``.
        attrs: the attribute schema, built with ``qbuild.attr``.
        outputs: declared output names; ``{name}`` is replaced by the target name and a
            trailing ``/`` declares a directory output.
        accelerators: resources beyond cores and memory that one action needs, by Dask
            resource name (``{"GPU": 1}``); a remote executor runs the action only on a
            worker that advertises them. Local builds do not budget them.
        machine_dependent: outputs depend on the CPU class the action runs on (results
            of running a model: calibration statistics, sensitivity, latency); the CPU
            architecture and instruction sets then enter the action key, so a shared
            cache never serves them to another machine class. Pure graph transforms leave
            it False and stay shareable.
        requires: distributions the rule needs installed; a target of the rule fails at
            analysis with ``install_hint`` when one is missing.
        install_hint: how to install ``requires`` (e.g. "pip install 'qbuild[onnx]'").
        provides: the provider classes every target of the rule gives (besides
            ``DefaultInfo``, which every target has); its actions return instances.
            ``attr.label(providers=[...])`` of dependents is checked against it at
            analysis.
    """

    kind: ClassVar[str] = ""
    version: ClassVar[int] = 1
    doc: ClassVar[str] = ""
    heavy: ClassVar[bool] = False
    reproducible: ClassVar[bool] = True
    cpu: ClassVar[int] = 1
    memory: ClassVar[int] = 0
    accelerators: ClassVar[Mapping[str, float]] = {}
    attrs: ClassVar[Mapping[str, Attr]] = {}
    outputs: ClassVar[Sequence[str]] = ()
    machine_dependent: ClassVar[bool] = False
    requires: ClassVar[Sequence[str]] = ()
    install_hint: ClassVar[str] = ""
    provides: ClassVar[Sequence[type[Provider]]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not cls.kind:
            return  # an abstract intermediate class
        if not _KIND.match(cls.kind):
            raise TypeError(f"{cls.__qualname__}.kind {cls.kind!r}: use lower_snake_case")
        if not isinstance(cls.version, int) or isinstance(cls.version, bool):
            raise TypeError(f"{cls.__qualname__}.version must be an int")
        for name, schema in cls.attrs.items():
            if not isinstance(schema, Attr):
                raise TypeError(f"{cls.__qualname__}.attrs[{name!r}] is not built with qbuild.attr")
            if name in RESERVED_KEYS:
                raise TypeError(f"{cls.__qualname__}: attribute name {name!r} is reserved")
            for provider in schema.providers:
                check_provider_class(provider, f"{cls.__qualname__}.attrs[{name!r}]")
            for other, _allowed in schema.when:
                if other not in cls.attrs:
                    raise TypeError(f"{cls.__qualname__}.attrs[{name!r}]: 'when' names "
                                    f"unknown attribute {other!r}")
        cls.provides = tuple(cls.provides)
        for provider in cls.provides:
            check_provider_class(provider, f"{cls.__qualname__}.provides")

    @classmethod
    def provider_names(cls) -> set[str]:
        """Names of every provider a target of this rule gives (DefaultInfo included)."""
        return {provider_name(DefaultInfo), *(provider_name(p) for p in cls.provides)}

    @classmethod
    def is_v2(cls) -> bool:
        """Whether the rule declares its actions in ``analyze`` (else ``run`` is one)."""
        return cls.analyze is not Rule.analyze

    def declared_outputs(self, name: str, attrs: Mapping[str, Any]) -> list[str]:
        """Output names for a target; override when they depend on attributes."""
        return [out.replace("{name}", name) for out in self.outputs]

    def validate(self, attrs: Mapping[str, Any]) -> None:
        """Check attribute combinations before anything runs.

        Raise ``ConfigError(message, attr=...)``; the engine adds file and target.
        """

    def is_reproducible(self, attrs: Mapping[str, Any]) -> bool:
        """Whether running again with the same inputs gives the same bytes."""
        return bool(self.reproducible)

    def env(self) -> dict[str, str]:
        """Environment facts that change outputs (library versions, ...): part of the key."""
        return {}

    @classmethod
    def missing_requirements(cls) -> list[str]:
        """Distributions in ``requires`` that are not installed."""
        from ..core.versions import dist_version

        return [d for d in cls.requires if dist_version(d) == "absent"]
    def target_env(self, attrs: Mapping[str, Any]) -> dict[str, str]:
        """Facts of one target's environment that change its outputs (e.g. the tools its
        command runs): part of that target's key. Computed on every full build."""
        return {}

    def resources(self, attrs: Mapping[str, Any]) -> tuple[int, int]:
        """(cores, MiB) one action of this target needs; override when they depend on
        attributes. Defaults to the class's ``cpu`` and ``memory``."""
        return self.cpu, self.memory

    def accelerators_for(self, attrs: Mapping[str, Any]) -> dict[str, float]:
        """Resources beyond cores and memory one action of this target needs (Dask
        resource name -> amount); override when they depend on attributes. Defaults to
        the class's ``accelerators``."""
        return dict(self.accelerators)

    def code(self, attrs: Mapping[str, Any]) -> list[str]:
        """Code the action imports by name at run time, beyond the rule's own package:
        ``"module"``, ``"module:function"`` or ``"hook:<hook name>"`` (every plugin
        implementing that hook). Its source files join the key."""
        return []

    def analyze(self, ctx: AnalysisContext) -> None:
        """Declare the target's actions with ``ctx.action(...)``.

        The default is for a rule that defines ``run`` instead: one action (named after
        the rule's kind) whose inputs are every dependency and file attribute, whose outputs
        are every declared output, and whose params are the other attributes with the
        target's label (``run`` sees the label, so it is part of the action's key)."""
        from .actions import DEPENDENCY_TYPES

        if type(self).run is Rule.run:
            raise ctx.fail(f"rule {self.kind!r} defines neither analyze() nor run()")
        types = ctx.attr_types
        inputs = [name for name, kind in types.items() if kind in DEPENDENCY_TYPES]
        values = {name: value for name, value in ctx.attrs.items()
                  if types.get(name) not in DEPENDENCY_TYPES}
        cls = type(self)
        ctx.action(run_rule, inputs=inputs, outputs=ctx.outputs, mnemonic=self.kind,
                   params={"rule": f"{cls.__module__}:{cls.__qualname__}",
                           "label": ctx.label, "build_file": ctx.build_file,
                           "attrs": values, "deps": {name: ctx.attrs.get(name)
                                                     for name in inputs}})

    def run(self, ctx: ActionContext) -> Any:
        """v1: produce every declared output; return the providers the rule declares
        (a Provider or a list of them) and/or an info dict (deprecated)."""
        raise NotImplementedError(f"rule {self.kind!r} has no run()")


@dataclass
class Dep:
    """A built dependency as a rule sees it: its files and providers.

    ``dep[OnnxModelInfo]`` is the dependency's provider (``KeyError`` naming what it
    has if it gives none), ``OnnxModelInfo in dep`` asks, ``dep[DefaultInfo].files``
    are its files. ``info`` is the dict a v1 rule returned (deprecated: use providers).
    In a v2 action ``label`` is empty: actions never see labels."""

    label: str
    files: list[Path]
    info: dict[str, Any] = field(default_factory=dict)
    root: Path | None = None  # directory the outputs are relative to
    digests: dict[str, str] = field(default_factory=dict)
    """SHA-256 of each output file, by path relative to ``root`` (verified by the engine:
    no need to hash the files again)."""
    providers: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Stored provider data by provider name (read them typed: ``dep[Cls]``)."""
    failed: str | None = None
    """Only for an attribute declared ``tolerate_failures``: the one-line reason the
    dependency failed (or was skipped); it then has no files and no providers."""

    def __contains__(self, cls: type[Provider]) -> bool:
        return cls is DefaultInfo or provider_name(cls) in self.providers

    def __getitem__(self, cls: type[P]) -> P:
        if cls is DefaultInfo:
            return cls(tuple(self.files))  # type: ignore[call-arg]
        data = self.providers.get(provider_name(cls))
        if data is None and self.failed is not None:
            raise KeyError(f"{self.label or 'the dependency'} failed: {self.failed}")
        if data is None:
            has = ", ".join(["DefaultInfo", *(n.rsplit(".", 1)[-1] for n in self.providers)])
            raise KeyError(f"{self.label or 'the dependency'} gives no {cls.__qualname__} "
                           f"(it gives: {has})")
        return decode(cls, data, self.root)

    @overload
    def get(self, cls: type[P]) -> P | None: ...
    @overload
    def get(self, cls: type[P], default: D) -> P | D: ...
    def get(self, cls: type[P], default: object = None) -> object:
        """The provider ``cls`` of this dependency, or ``default``."""
        return self[cls] if cls in self else default

    def digest(self, path: Path) -> str | None:
        """The engine's digest of one of this dependency's files (None if unknown)."""
        if self.root is None:
            return None
        try:
            return self.digests.get(path.relative_to(self.root).as_posix())
        except ValueError:
            return None

    @property
    def file(self) -> Path:
        """The dependency's single output file."""
        if len(self.files) != 1:
            names = ", ".join(p.name for p in self.files) or "none"
            raise RuleError(f"{self.label} has {len(self.files)} outputs ({names}); "
                            "expected exactly one")
        return self.files[0]

    def output(self, name: str) -> Path:
        """The dependency's output called ``name`` (a declared output name)."""
        for path in self.files:
            if self.root is not None and path.relative_to(self.root).as_posix().rstrip("/") == \
                    name.rstrip("/"):
                return path
            if path.name == name.rstrip("/"):
                return path
        names = ", ".join(p.name for p in self.files) or "none"
        raise RuleError(f"{self.label} has no output {name!r} (it has: {names})")


class ActionContext:
    """What a rule's ``run`` gets: its target's label, resolved attributes (dependencies
    as ``Dep``s), output paths, a scratch dir and a log. It is the ``RunContext`` of the
    one action ``run`` is (``run_rule``) with the target's names added: logging,
    warnings, hooks, progress and paths are that context's."""

    def __init__(self, run: RunContext, *, label: str, build_file: str,
                 attrs: dict[str, Any]) -> None:
        self._run = run
        self.label = label
        self.name = label.rsplit(":", 1)[1]
        self.package = label[2:].rsplit(":", 1)[0]
        self.build_file = build_file
        self.attrs = attrs
        self.workdir = run.workdir
        self.threads = run.threads
        """Cores this action was granted: give every onnxruntime session (and any
        thread pool) exactly this many threads, so parallel actions never oversubscribe."""
        self.log_path = run.log_path
        self.warnings = run.warnings

    @property
    def scratch(self) -> Path:
        """A private empty folder for temporary files."""
        return self._run.scratch

    @property
    def hooks(self) -> Any:
        """The plugin hooks this rule declared in ``code()`` (``"hook:<name>"``), with
        the implementations the main process resolved: ``ctx.hooks.<name>(...)``, or
        ``ctx.hooks.pluginmanager`` for code that takes a pluggy plugin manager."""
        return self._run.hooks

    @property
    def outputs(self) -> dict[str, Path]:
        """Every declared output name mapped to the path to write."""
        return self._run.outputs

    def output(self, name: str) -> Path:
        """The path to write the declared output ``name`` (``{name}`` allowed)."""
        key = name.replace("{name}", self.name)
        found = self._run.outputs.get(key)
        if found is None:
            raise RuleError(f"rule wrote undeclared output {key!r}; declared: "
                            f"{', '.join(self._run.outputs)}", target=self.label)
        return found

    def log(self, message: str) -> None:
        """Append a line to the action log (its tail is shown if the action fails)."""
        self._run.log(message)

    def warn(self, message: str) -> None:
        """Show a warning to the user (also logged)."""
        self._run.warn(message)

    def progress(self, done: int, total: int) -> None:
        """Say how far ``run`` is (``done`` of ``total``); see ``RunContext.progress``."""
        self._run.progress(done, total)

    def workspace_path(self, path: str | os.PathLike[str]) -> str:
        """A staged path as the user knows it; see ``RunContext.workspace_path``."""
        return self._run.workspace_path(path)

    def fail(self, message: str, attr: str | None = None) -> RuleError:
        """An error naming this target (and attribute); ``raise ctx.fail(...)``."""
        return RuleError(message, file=self.build_file, target=self.label, attr=attr)


def run_rule(ctx: RunContext) -> Any:
    """The action a rule that defines ``run`` declares (``Rule.analyze``'s default):
    an ``ActionContext`` made from the action's inputs and params, then ``run``."""
    from .actions import resolve_function

    params = ctx.params
    cls = resolve_function(params["rule"])
    attrs: dict[str, Any] = dict(params["attrs"])
    for name, given in params["deps"].items():
        staged = ctx.inputs.get(name)
        if isinstance(staged, Dep):
            staged = replace(staged, label=given)
        elif isinstance(staged, list) and staged and isinstance(staged[0], Dep):
            staged = [replace(dep, label=label) for dep, label in zip(staged, given)]
        attrs[name] = staged
    return cls().run(ActionContext(ctx, label=params["label"],
                                   build_file=params["build_file"], attrs=attrs))


RUN_RULE = "qbuild.api.rule:run_rule"
"""The reference of ``run_rule``: its info dict (deprecated) is the only one kept."""


def check_attrs(rule: Rule, raw: Mapping[str, Any]) -> dict[str, Any]:
    """Validate raw BUILD values against the schema and apply defaults.

    Raises ConfigError with ``attr`` set; the caller adds file and target.
    """
    unknown = [key for key in raw if key not in rule.attrs]
    if unknown:
        known = ", ".join(sorted(rule.attrs)) or "none"
        raise ConfigError(f"unknown attribute for rule '{rule.kind}' (known: {known})",
                          attr=unknown[0])
    values: dict[str, Any] = {}
    for name, schema in rule.attrs.items():
        if name in raw:
            try:
                values[name] = schema.check(raw[name])
            except ConfigError as exc:
                raise exc.located(attr=name) from None
        elif schema.required:
            raise ConfigError(f"missing required attribute ({schema.type_name()}): "
                              f"{schema.doc or 'no help'}", attr=name)
        else:
            values[name] = schema.default_value()
    return values


def inactive_attrs(rule: Rule, values: Mapping[str, Any]) -> list[str]:
    """Attributes whose ``when`` condition the target's values do not meet."""
    return [name for name, schema in rule.attrs.items()
            if schema.when and not schema.applies(values)]
