"""Rule API v2: the analysis context where a rule declares its actions, the declared
action records, and the context an action function runs with.

``Rule.analyze(ctx)`` calls ``ctx.action(function, inputs=..., outputs=..., params=...)``
once per action. Each action is cached on its own: its key covers its function's code,
its params, the content of its inputs (dependency files and providers, sources, outputs
of earlier actions of the same target) and the names of its outputs, never the target's
label, so an action whose inputs did not change is not run again when another action of
the same target must run. Action functions get a ``RunContext``: inputs, params and
output paths, no label.
"""

from __future__ import annotations

import importlib
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.errors import ConfigError, RuleError
from ..core.live import PROGRESS_NAME

DEPENDENCY_TYPES = ("label", "label_list", "file", "files")


@dataclass(frozen=True)
class ActionSpec:
    """One declared action: plain data (picklable, JSON-able), no label."""

    mnemonic: str
    function: str  # "module:qualname" of a module-level function
    inputs: tuple[str, ...]  # attribute names or outputs of earlier actions
    outputs: tuple[str, ...]
    params: dict[str, Any] = field(default_factory=dict)
    heavy: bool = False
    # file/files input -> where each item is staged, relative to ``RunContext.root``
    layout: dict[str, list[str]] = field(default_factory=dict)
    # dependency inputs may be hard links to the cache's blobs (``_linked``); not keyed:
    # staging never changes an input's bytes
    link_inputs: bool = False

    def describe(self) -> dict[str, Any]:
        described = {"mnemonic": self.mnemonic, "function": self.function,
                     "inputs": list(self.inputs), "outputs": list(self.outputs),
                     "params": self.params, "heavy": self.heavy}
        if self.layout:
            described["layout"] = self.layout
        if self.link_inputs:
            described["link_inputs"] = True
        return described


def function_ref(fn: Callable[..., Any]) -> str:
    """``module:qualname`` of a module-level function (importable by worker processes)."""
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    if not module or not qualname or "<locals>" in qualname or "<lambda>" in qualname:
        raise ConfigError(f"action function {fn!r} must be a module-level function "
                          "(worker processes import it by name)")
    if resolve_function(f"{module}:{qualname}") is not fn:
        raise ConfigError(f"action function {module}:{qualname} cannot be imported by name")
    return f"{module}:{qualname}"


def forward_files(ctx: RunContext) -> None:
    """An action function giving each input file, unchanged, as the output of the same
    position (``filegroup``'s action). The engine knows it: it stores each source's
    bytes (one private copy, checked against the digest the key holds) without a
    sandbox or a call; this body runs only where that does not apply (inputs from
    other targets, a layout, names repeated), with the same result."""
    files = [path for value in ctx.inputs.values() if value is not None
             for path in (value if isinstance(value, list) else [value])]
    outputs = list(ctx.outputs.values())
    if len(files) != len(outputs):
        raise RuleError(f"forward_files got {len(files)} input files for "
                        f"{len(outputs)} outputs")
    for path, out in zip(files, outputs):
        try:
            # A staged input is this action's private copy: moving it costs no I/O.
            os.rename(path, out)
        except OSError:
            with open(path, "rb") as src, open(out, "wb") as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)


FORWARD_FILES = "qbuild.api.actions:forward_files"


def resolve_function(ref: str) -> Any:
    module_name, qualname = ref.split(":", 1)
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


class AnalysisContext:
    """What ``Rule.analyze`` gets: the target's name, checked attributes (dependencies as
    label strings, sources as workspace-relative paths), declared outputs, and
    ``action(...)`` to declare actions."""

    def __init__(self, *, label: str, attrs: Mapping[str, Any], attr_types: Mapping[str, str],
                 outputs: Sequence[str], heavy: bool, build_file: str = "") -> None:
        self.label = label
        self.name = label.rsplit(":", 1)[1]
        self.build_file = build_file
        """The BUILD file declaring the target, workspace-relative."""
        self.attrs = dict(attrs)
        self.outputs = list(outputs)
        self._attr_types = dict(attr_types)
        self._heavy = heavy
        self.actions: list[ActionSpec] = []
        self._made: dict[str, str] = {}  # output name -> mnemonic of the action making it

    def output(self, name: str) -> str:
        """The declared output name (``{name}`` replaced)."""
        key = name.replace("{name}", self.name)
        if key not in self.outputs:
            raise ConfigError(f"'{key}' is not a declared output (declared: "
                              f"{', '.join(self.outputs) or 'none'})")
        return key

    @property
    def attr_types(self) -> dict[str, str]:
        """Each attribute's declared type (``"label"``, ``"file"``, ``"int"``, ...)."""
        return dict(self._attr_types)

    def fail(self, message: str, attr: str | None = None) -> ConfigError:
        """An analysis error (exit 2) naming this target; ``raise ctx.fail(...)``."""
        return ConfigError(message, attr=attr)

    def action(self, function: Callable[[RunContext], Any], *, outputs: Sequence[str],
               inputs: Sequence[str] = (), params: Mapping[str, Any] | None = None,
               mnemonic: str | None = None, heavy: bool | None = None,
               layout: Mapping[str, Sequence[str]] | None = None,
               link_inputs: bool = False) -> ActionSpec:
        """Declare an action.

        Args:
            function: a module-level ``fn(ctx: RunContext)`` returning the providers it
                gives (a Provider, a list of them, or None).
            outputs: declared output names it writes (``{name}`` allowed); every
                declared output is written by exactly one action.
            inputs: names of dependency/file attributes, or outputs of actions declared
                before this one; the function reads them as ``ctx.inputs[name]``.
            params: JSON values the function reads as ``ctx.params`` (part of its key).
            mnemonic: the action's name in ``qbuild aquery`` (default: function name).
            heavy: run in a worker process (default: the rule's ``heavy``).
            layout: for ``file``/``files`` inputs, where to stage each item of the
                attribute (in order), relative to ``ctx.root``: a source at that path,
                a dependency's outputs in that folder (part of the key). Without it,
                inputs are staged under the engine's own folders (``ctx.inputs``).
            link_inputs: the function only reads its inputs and accepts hard-linked
                files: dependency inputs may then be staged as hard links to the
                cache's read-only blobs where the filesystem has no reflinks (no data
                copied). Writing to one, even as root, is detected after the action:
                the action fails and the blob is dropped from the cache. Leave it off
                for tools that refuse hard-linked files (onnx refuses hard-linked
                external data); sources are always private copies.
        """
        ref = function_ref(function)
        mnemonic = mnemonic or function.__name__
        if any(a.mnemonic == mnemonic for a in self.actions):
            raise ConfigError(f"two actions named {mnemonic!r}; give each a mnemonic")
        outs = tuple(self.output(o) for o in outputs)
        for out in outs:
            if out in self._made:
                raise ConfigError(f"output '{out}' is written by two actions "
                                  f"({self._made[out]} and {mnemonic})")
        names: list[str] = []
        for name in inputs:
            if name in self._attr_types:
                if self._attr_types[name] not in DEPENDENCY_TYPES:
                    raise ConfigError(f"action {mnemonic}: input '{name}' is a value "
                                      "attribute; pass values as params")
                names.append(name)
                continue
            made = name.replace("{name}", self.name)
            if made not in self._made:
                raise ConfigError(f"action {mnemonic}: input '{name}' is neither a "
                                  "dependency attribute nor an output of an earlier action")
            names.append(made)
        try:
            text = json.dumps(dict(params or {}), sort_keys=True, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"action {mnemonic}: params must be JSON values ({exc})") from None
        spec = ActionSpec(mnemonic, ref, tuple(names), outs, json.loads(text),
                          self._heavy if heavy is None else bool(heavy),
                          self._layout(mnemonic, names, layout or {}), bool(link_inputs))
        for out in outs:
            self._made[out] = mnemonic
        self.actions.append(spec)
        return spec

    def _layout(self, mnemonic: str, inputs: list[str],
                layout: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
        """``layout`` checked: file inputs only, one clean relative path per item, no
        two the same or one inside another."""
        out: dict[str, list[str]] = {}
        taken: dict[str, Any] = {}  # path -> the item staged there
        parents: set[str] = set()
        for name, paths in layout.items():
            kind = self._attr_types.get(name)
            if name not in inputs or kind not in ("file", "files"):
                raise ConfigError(f"action {mnemonic}: layout names '{name}', which is not "
                                  "a file or files input of the action")
            value = self.attrs.get(name)
            items = [] if value is None else [value] if kind == "file" else list(value)
            paths = [str(p) for p in paths]
            if len(paths) != len(items):
                raise ConfigError(f"action {mnemonic}: layout of '{name}' gives "
                                  f"{len(paths)} paths for {len(items)} items", attr=name)
            for path, item in zip(paths, items):
                parts = path.split("/")
                if not path or path.startswith("/") or any(
                        p in ("", ".", "..") for p in parts) or "\0" in path:
                    raise ConfigError(f"action {mnemonic}: layout path {path!r} must be a "
                                      "plain relative path", attr=name)
                if path in taken and taken[path] == item:
                    continue  # the same item listed twice
                ancestors = {"/".join(parts[:i]) for i in range(1, len(parts))}
                if path in taken or path in parents or not ancestors.isdisjoint(taken):
                    raise ConfigError(f"action {mnemonic}: layout path {path!r} is given "
                                      "twice or inside another", attr=name)
                taken[path] = item
                parents.update(ancestors)
            out[name] = paths
        return out

    def finish(self) -> list[ActionSpec]:
        """The declared actions, checked to write every declared output."""
        if not self.actions:
            raise ConfigError("analyze() declared no action")
        missing = [o for o in self.outputs if o not in self._made]
        if missing:
            raise ConfigError(f"no action writes declared output(s) {', '.join(missing)}")
        return list(self.actions)


class RunContext:
    """What an action function gets: its inputs, params, output paths, a scratch folder,
    a log and its thread grant. No label: an action's bytes depend only on its key."""

    THIS_TARGET = "<this target>"
    """Stands for the target's label in a warning (``ctx.warn(f"... qbuild log
    {ctx.THIS_TARGET}")``): the engine writes the label of the target it reports the
    warning for, since one cached action may serve several targets."""

    def __init__(self, *, inputs: dict[str, Any], params: dict[str, Any],
                 outputs: dict[str, Path], scratch: Path, log_path: Path, workdir: Path,
                 threads: int = 1, origins: dict[str, list[tuple[int, str]]] | None = None,
                 hooks: Mapping[str, tuple[str, ...]] | None = None,
                 root: Path | None = None, names: Callable[[str], str] | None = None,
                 dep_targets: Mapping[str, tuple[str, str]] | None = None) -> None:
        self.inputs = inputs
        self._names = names
        self._dep_targets = dict(dep_targets or {})
        self._progress_at = 0.0
        self.root = root if root is not None else workdir / "ws"
        """Where inputs declared with a ``layout`` are staged."""
        self._hooks = dict(hooks or {})
        self._resolved: Any = None
        self.origins = origins or {}
        """For ``file``/``files`` inputs: for each path in ``inputs[name]``, the index of
        the attribute item it comes from and its path inside that item (the output's
        path in the dependency's folder, or the source's path in its package)."""
        self.params = params
        self._outputs = outputs
        self._scratch = scratch
        self._scratch_made = False
        self.workdir = workdir
        self.threads = threads
        """Cores this action was granted (give onnxruntime sessions this many threads)."""
        self.log_path = log_path
        self.warnings: list[str] = []

    @property
    def scratch(self) -> Path:
        """A private empty folder for temporary files (made on first use: most actions
        need none, and every folder costs a ``mkdir`` and an ``rmdir``)."""
        if not self._scratch_made:
            self._scratch.mkdir(parents=True, exist_ok=True)
            self._scratch_made = True
        return self._scratch

    @property
    def hooks(self) -> Any:
        """The plugin hooks the rule declared in ``code()`` (``"hook:<name>"``), with the
        implementations the main process resolved: ``ctx.hooks.<name>(...)``, or
        ``ctx.hooks.pluginmanager`` for code that takes a pluggy plugin manager."""
        from .hooks import ResolvedHooks

        if self._resolved is None:
            self._resolved = ResolvedHooks(self._hooks)
        return self._resolved

    @property
    def outputs(self) -> dict[str, Path]:
        """This action's output names mapped to the paths to write."""
        return dict(self._outputs)

    def output(self, name: str) -> Path:
        """The path to write this action's output ``name``."""
        try:
            return self._outputs[name]
        except KeyError:
            raise RuleError(f"the action wrote undeclared output {name!r}; its outputs: "
                            f"{', '.join(self._outputs)}") from None

    def log(self, message: str) -> None:
        """Append a line to the action log (its tail is shown if the action fails)."""
        with open(self.log_path, "a", encoding="utf-8") as handle:
            handle.write(message.rstrip("\n") + "\n")

    def warn(self, message: str) -> None:
        """Show a warning to the user (also logged)."""
        self.warnings.append(message)
        self.log(f"WARNING: {message}")

    def fail(self, message: str, attr: str | None = None) -> RuleError:
        """An action error; the engine names the target. ``raise ctx.fail(...)``."""
        return RuleError(message, attr=attr)

    def fail_at(self, name: str, message: str, attr: str | None = None) -> RuleError:
        """An action error that belongs to the target given as the ``label`` input
        ``name`` (a dataset whose ``input`` names no model input is that dataset's
        mistake): it names that target's BUILD file, label and ``attr``. ``raise
        ctx.fail_at("dataset", "...", attr="input")``."""
        where = self._dep_targets.get(name)
        if where is None:
            return RuleError(message, attr=name)
        label, build_file = where
        return RuleError(message, file=build_file, target=label, attr=attr)

    def workspace_path(self, path: str | os.PathLike[str]) -> str:
        """A path inside this action's sandbox as the user knows it: a source by its
        workspace path (``images/calib/notes.txt``), a dependency's output under
        ``qbuild-out/``; other paths as given. For messages: an action's key and bytes
        never depend on it."""
        text = os.fspath(path)
        try:
            rel = Path(text).relative_to(self.workdir).as_posix()
        except ValueError:
            return text
        return self._names(rel) if self._names is not None else rel

    def progress(self, done: int, total: int) -> None:
        """Say how far the action is (``done`` of ``total`` samples, trials, ...): the
        console shows it on its live line while the action runs. Cheap to call often
        (it writes at most about four times a second)."""
        now = time.monotonic()
        if done < total and now - self._progress_at < 0.25:
            return
        self._progress_at = now
        path = self.workdir / PROGRESS_NAME
        temp = path.with_name(PROGRESS_NAME + ".tmp")
        try:
            temp.write_text(f"{int(done)} {int(total)}\n", encoding="ascii")
            os.replace(temp, path)
        except OSError:
            pass  # progress is a courtesy: never a reason for an action to fail
