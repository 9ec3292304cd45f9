"""Running a v2 target: its declared actions in order, each cached on its own key.

A v2 target is scheduled as one unit (its target key, as for v1 rules, answers a no-op
build with one lookup). When that key misses, each declared action is keyed from its own
parts only (function and code, params, output names, the content of its inputs, never
the label) and looked up; only the actions whose key misses run, each in a sandbox of
its own holding just its inputs (a dependency under ``<attribute>.dep`` or
``<attribute>.dep<index>/``, sources under ``<attribute>.src/<path in the package>``,
earlier outputs under ``made/``; a declared layout under ``ws/``): flat, because every
folder costs a ``mkdir`` and an ``rmdir``; the text after the last dot tells the folders
of one attribute, and of different attributes, apart.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
import stat
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..api.actions import FORWARD_FILES, ActionSpec, RunContext, resolve_function
from ..api.providers import returned_providers
from ..api.rule import Dep
from ..core.errors import QbuildError, RuleError
from ..core.files import stat_key
from ..core.records import Action, ActionResult, Outcome, OutputEntry
from ..keys.parts import canonical_json
from ..keys.parts import dep_part as _dep_part
from .linked import Linked, release, stage_link

if TYPE_CHECKING:
    from .local import LocalExecutor

Made = dict[str, list[OutputEntry]]  # outputs of earlier actions, by output name
_names = itertools.count()  # names of forwarded copies (next() is atomic under the GIL)


def _package_path(action: Action, rel: str) -> str:
    package = action.label.package
    return rel[len(package) + 1:] if package else rel


def _item_part(action: Action, item: str) -> dict[str, Any]:
    if item.startswith("//"):
        return {"dep": _dep_part(action.deps[item])}
    return {"src": _package_path(action, item), "digest": action.sources[item][0],
            "x": item in action.executable}


def _input_part(action: Action, name: str, made: Made) -> Any:
    kind = action.attr_types.get(name)
    if kind is None:
        entries = made[name]
        return {"made": {e.path: e.digest for e in entries},
                "executable": sorted(e.path for e in entries if e.executable)}
    value = action.attrs[name]
    if value is None:
        return None
    if kind == "label":
        return _dep_part(action.deps[value])
    if kind == "label_list":
        return [_dep_part(action.deps[v]) for v in value]
    if kind == "file":
        return _item_part(action, value)
    return [_item_part(action, item) for item in value]


def step_components(action: Action, index: int, made: Made) -> dict[str, Any]:
    """The key parts of declared action ``index`` (``made``: outputs of earlier ones)."""
    spec: ActionSpec = action.steps[index]
    parts = {**action.step_base, "action": spec.mnemonic, "function": spec.function,
             "code": action.step_code[index], "params": spec.params,
             "outputs": list(spec.outputs),
             "inputs": {name: _input_part(action, name, made) for name in spec.inputs}}
    if spec.layout:  # only actions declaring one have the part (other keys stay)
        parts["layout"] = spec.layout
    return parts


def step_key(parts: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json(parts).encode("utf-8")).hexdigest()


def _entries_of(name: str, entries: tuple[OutputEntry, ...]) -> list[OutputEntry]:
    if name.endswith("/"):
        return [e for e in entries if e.path.startswith(name)]
    return [e for e in entries if e.path == name]


def plan_steps(store: Any, action: Action) -> list[dict[str, Any]]:
    """Each declared action's key as far as it can be known without running anything
    (an action after one that is not cached has no key yet), and whether it is cached."""
    made: Made = {}
    out = []
    for index, spec in enumerate(action.steps):
        if any(name not in action.attr_types and name not in made for name in spec.inputs):
            out.append({"spec": spec, "key": None, "cached": False})
            continue
        key = step_key(step_components(action, index, made))
        cached = store.get_action(key)
        if cached is not None:
            for name in spec.outputs:
                made[name] = _entries_of(name, cached.outputs)
        out.append({"spec": spec, "key": key, "cached": cached is not None})
    return out


def _invoke_step(rule_ref: str, function: str, ctx: RunContext, out_root: Path
                 ) -> tuple[dict[str, Any], list[str]]:
    """Run one action function; also the entry point of worker processes."""
    rule_cls = resolve_function(rule_ref)
    fn = resolve_function(function)
    try:
        value = fn(ctx)
    except QbuildError:
        raise
    except BaseException as exc:  # sys.exit() and the like too: the action fails
        import traceback

        ctx.log(traceback.format_exc())
        what = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        if isinstance(exc, SystemExit):
            what = f"the action called sys.exit({exc.code!r})"
        raise RuleError(what) from None
    info, providers = returned_providers(value, out_root, tuple(rule_cls.provides))
    if info:
        raise RuleError(f"action {function} returned an info dict; v2 actions return "
                        "providers")
    return providers, ctx.warnings


class _Sandbox:
    """A private folder for one action, locked while it lives (see clean_stale_sandboxes):
    an emptied one a finished action left (``_Trash.take``), else a new one."""

    def __init__(self, executor: LocalExecutor) -> None:
        from .local import new_sandbox

        self.lock: int | None
        reused = executor._trash.take()
        if reused is not None:
            self.path, self.lock, kept, self.mode = reused
            self.lock_file = False
        else:
            self.path, self.lock, self.lock_file = new_sandbox(executor.store.tmp)
            kept = set()
            self.mode = os.fstat(self.lock).st_mode if self.lock is not None and \
                not self.lock_file else 0
            self.mode = stat.S_IMODE(self.mode)
        self.dirs = _Dirs(self.path, kept)

    def close(self, executor: LocalExecutor) -> None:
        """Hand the sandbox to the executor's background deletion, or emptying for the
        next action (off the action's critical path: deleting folders costs more than
        making them)."""
        executor._trash.put(self.path, self.lock, self.lock_file, self.dirs.known,
                            self.mode)


def _place(executor: LocalExecutor, entry: OutputEntry, dest: Path,
           staged: dict[Path, tuple[str, str]], linked: list[Linked] | None) -> bool:
    """Stage one blob at ``dest``: a hard link if the action allows it (and the blob is
    not executable: a link shares the blob's mode), else a verified private copy."""
    if dest in staged or (linked and any(item.dest == dest for item in linked)):
        return True  # the same output listed twice
    if linked is not None and not entry.executable and \
            stage_link(executor.store, entry.digest, dest, linked):
        return True
    if not executor.store.restore_blob(entry.digest, dest, entry.executable):
        return False
    staged[dest] = (entry.digest, stat_key(os.lstat(dest)))
    return True


class _Dirs:
    """The folders of one sandbox made so far: each new one costs one ``mkdir``, with
    no failed attempts (``Path.mkdir(parents=True)`` tries the deepest first). In a
    reused sandbox, the (empty) folders the last action left are taken as they are, and
    those this action does not use are removed (``prune``), so every action sees exactly
    the folders a new sandbox would have."""

    def __init__(self, root: Path, kept: set[Path] | None = None) -> None:
        self.known = {root}
        self.root = root
        self.kept = (kept or set()) - {root}

    def make(self, path: Path) -> Path:
        if path not in self.known:
            self.make(path.parent)
            if path not in self.kept:
                try:
                    os.mkdir(path)
                except FileExistsError:
                    pass
            self.known.add(path)
        return path

    def prune(self) -> None:
        for path in sorted(self.kept - self.known, key=lambda p: len(p.parts),
                           reverse=True):
            try:
                os.rmdir(path)
            except OSError:
                shutil.rmtree(path)
        self.kept = set()


def _stage_dep(executor: LocalExecutor, label: str, dep: ActionResult, base: Path,
               staged: dict[Path, tuple[str, str]], linked: list[Linked] | None = None,
               dirs: _Dirs | None = None) -> Dep:
    from .local import MissingBlob

    for entry in dep.outputs:
        dest = base / entry.path
        if dirs is not None:
            dirs.make(dest.parent)
        if not _place(executor, entry, dest, staged, linked):
            raise MissingBlob(label)
    if dirs is not None:
        dirs.make(base)
    else:
        base.mkdir(parents=True, exist_ok=True)
    files = [base / name.rstrip("/") for name in dep.declared]
    return Dep("", files, dict(dep.info), base, dep.digests(), dict(dep.providers),
               dep.failed)


def _stage_item(executor: LocalExecutor, action: Action, item: str, base: Path, index: int,
                staged: dict[Path, tuple[str, str]], origins: list[tuple[int, str]],
                at: Path | None = None, linked: list[Linked] | None = None,
                dirs: _Dirs | None = None) -> list[Path]:
    """Stage one item of a file/files attribute (at ``at`` if the action's layout
    says where)."""
    if item.startswith("//"):
        dep = action.deps[item]
        files = _stage_dep(executor, item, dep,
                           at or base.with_name(f"{base.name}.dep{index}"), staged,
                           linked, dirs).files
        origins.extend((index, name.rstrip("/")) for name in dep.declared)
        return files
    rel = _package_path(action, item)
    dest = at or base.with_name(f"{base.name}.src") / rel
    if dirs is not None:
        dirs.make(dest.parent)
    else:
        dest.parent.mkdir(parents=True, exist_ok=True)
    digest, key = action.sources[item]
    if dest not in staged:  # (an item listed twice is staged once)
        staged[dest] = (digest, executor._stage_source(action, item, key, dest))
    origins.append((index, rel))
    return [dest]


def _stage(executor: LocalExecutor, action: Action, spec: ActionSpec, sandbox: Path,
           made: Made, log_path: Path, linked: list[Linked], dirs: _Dirs
           ) -> tuple[RunContext, dict[Path, tuple[str, str]]]:
    links = linked if spec.link_inputs else None
    staged: dict[Path, tuple[str, str]] = {}
    inputs: dict[str, Any] = {}
    origins: dict[str, list[tuple[int, str]]] = {}
    root = sandbox / "ws"  # RunContext.root: inputs staged where the layout says
    for name in spec.inputs:
        kind = action.attr_types.get(name)
        base = sandbox / name  # inputs go to <name>.dep... and <name>.src/
        layout = spec.layout.get(name)
        if kind is None:
            for entry in made[name]:
                dest = dirs.make(sandbox / "made") / entry.path
                dirs.make(dest.parent)
                if not _place(executor, entry, dest, staged, links):
                    raise _MadeMissing(name)
            inputs[name] = sandbox / "made" / name.rstrip("/")
            continue
        value = action.attrs[name]
        if value is None:
            inputs[name] = None
        elif kind == "label":
            inputs[name] = _stage_dep(executor, value, action.deps[value],
                                      base.with_name(f"{name}.dep"), staged, links, dirs)
        elif kind == "label_list":
            inputs[name] = [_stage_dep(executor, v, action.deps[v],
                                       base.with_name(f"{name}.dep{i}"), staged, links, dirs)
                            for i, v in enumerate(value)]
        elif kind == "file":
            origins[name] = []
            files = _stage_item(executor, action, value, base, 0, staged, origins[name],
                                root / layout[0] if layout else None, links, dirs)
            if len(files) != 1:  # as Dep.file: a file attribute names one file
                raise RuleError(f"the target given as '{name}' has {len(files)} outputs; "
                                "expected exactly one", attr=name)
            inputs[name] = files[0]
        else:
            origins[name] = []
            inputs[name] = [path for i, item in enumerate(value)
                            for path in _stage_item(executor, action, item, base, i, staged,
                                                    origins[name],
                                                    root / layout[i] if layout else None,
                                                    links, dirs)]
    out_root = sandbox / "out"
    outputs = {}
    for name in spec.outputs:
        path = out_root / name.rstrip("/")
        dirs.make(path if name.endswith("/") else path.parent)
        outputs[name] = path
    dirs.make(out_root)
    dirs.prune()
    scratch = sandbox / "_scratch"  # made when the action first asks for it
    ctx = RunContext(inputs=inputs, params=json.loads(json.dumps(spec.params)),
                     outputs=outputs, scratch=scratch, log_path=log_path, workdir=sandbox,
                     threads=action.threads, origins=origins, hooks=action.hooks,
                     root=root)
    return ctx, staged


def _forwardable(action: Action, spec: ActionSpec) -> list[tuple[str, str]] | None:
    """(source, output name) pairs if ``forward_files`` can run without a sandbox: every
    input a source file of this target (no dependency, no layout, no earlier action's
    output), each named once, one plain output per input."""
    items: list[str] = []
    for name in spec.inputs:
        kind = action.attr_types.get(name)
        if kind not in ("file", "files") or name in spec.layout:
            return None
        value = action.attrs[name]
        if value is not None:
            items.extend([value] if kind == "file" else value)
    outputs = list(spec.outputs)
    if len(items) != len(outputs) or len(set(items)) != len(items) or \
            len(set(outputs)) != len(outputs) or \
            any(item.startswith("//") or item not in action.sources for item in items) or \
            any(name.endswith("/") for name in outputs):
        return None
    return list(zip(items, outputs))


def _forward(executor: LocalExecutor, action: Action, spec: ActionSpec,
             pairs: list[tuple[str, str]]) -> ActionResult:
    """Run ``forward_files`` over source files without a sandbox or a call: each source
    is copied (read-only, checked against the stat its digest was taken with, before
    and after) into a private folder of the store's ``tmp/`` and moved into the store
    as the output's blob; nothing else runs, so there is nothing else to check."""
    from .local import ActionFailed

    folder = executor.forward_dir()
    entries = []
    for item, name in pairs:
        digest, key = action.sources[item]
        temp = folder / str(next(_names))  # (unique: a file left behind is in no one's way)
        copied = executor.copy_source(action, item, key, temp)
        adopted = False
        try:
            adopted = executor.store.put_blob(temp, digest, adopt=True, hashed=copied)
        finally:
            if not adopted:  # an intact copy was there already (or storing failed)
                temp.unlink(missing_ok=True)
        entries.append(OutputEntry(name, digest, copied.st_size,
                                   bool(copied.st_mode & stat.S_IXUSR)))
    for path, (digest, key) in action.sources.items():
        if not executor.digests.still(executor.root / path, digest, key):
            raise ActionFailed(RuleError(
                f"input {path} changed while the action ran; its result was not "
                "cached. Run the build again.", target=str(action.label)))
    return ActionResult(tuple(entries), tuple(spec.outputs), {}, (), providers={})


def _run_step(executor: LocalExecutor, action: Action, spec: ActionSpec,
              made: Made) -> ActionResult:
    from .local import ActionFailed, _tail

    if spec.function == FORWARD_FILES:
        pairs = _forwardable(action, spec)
        if pairs is not None:
            return _forward(executor, action, spec, pairs)
    box = _Sandbox(executor)
    log_path = box.path / "_action.log"  # made by the first log line (opened "a")
    linked: list[Linked] = []
    intact = False
    try:
        ctx, staged = _stage(executor, action, spec, box.path, made, log_path, linked,
                             box.dirs)
        out_root = box.path / "out"
        failed: ActionFailed | None = None
        try:
            if spec.heavy:
                providers, warnings = executor._run_in_worker(
                    action, log_path, _invoke_step, action.rule_ref, spec.function, ctx,
                    out_root)
            else:
                providers, warnings = _invoke_step(action.rule_ref, spec.function, ctx,
                                                   out_root)
        except QbuildError as exc:
            located = exc.located(file=action.build_file, target=str(action.label))
            if len(action.steps) > 1:  # say which one
                located.message = f"action {spec.mnemonic}: {located.message}"
            failed = ActionFailed(located, _tail(log_path))
        # Failed or not: a linked input written to is the cache's blob, discarded here.
        executor._check_linked(action, box.path, linked)
        intact = True
        if failed is not None:
            raise failed
        executor._check_inputs(action, box.path, staged)
        for item in linked:
            staged.setdefault(item.dest, (item.digest, stat_key(item.stat)))
        entries = executor._collect(action, out_root, log_path, tuple(spec.outputs),
                                    staged=staged)
        for path, (digest, key) in action.sources.items():
            if not executor.digests.still(executor.root / path, digest, key):
                raise ActionFailed(RuleError(
                    f"input {path} changed while the action ran; its result was not "
                    "cached. Run the build again.", target=str(action.label)))
        return ActionResult(tuple(entries), tuple(spec.outputs), {}, tuple(warnings),
                            providers=providers)
    finally:
        release(executor.store, linked, intact)
        box.close(executor)


class _MadeMissing(Exception):
    """An earlier action's cached output could not be restored (its blob is gone)."""


def execute_steps(executor: LocalExecutor, action: Action) -> Outcome:
    """Run a v2 target: each declared action in order, served from the cache when its
    own key hits (with every blob present), run otherwise."""
    from .local import ActionFailed

    started = time.monotonic()
    # A blob found missing while staging is dropped from the store's index, so going
    # through the actions again runs the one that made it.
    for _attempt in range(len(action.steps)):
        try:
            outcome = _execute_steps(executor, action)
            break
        except _MadeMissing:
            continue
    else:
        raise ActionFailed(RuleError("the outputs of its earlier actions could not be "
                                     "restored from the cache", target=str(action.label)))
    return Outcome(outcome.result, time.monotonic() - started, steps=outcome.steps)


def _execute_steps(executor: LocalExecutor, action: Action) -> Outcome:
    from .local import ActionFailed

    store = executor.store
    made: Made = {}
    providers: dict[str, Any] = {}
    warnings: list[str] = []
    steps: list[tuple[str, str, str]] = []
    for index, spec in enumerate(action.steps):
        if action.keyed_by_step:
            # The target's key is this action's: the caller looked it up (a miss) and
            # stores the result under it.
            key, status = action.key, "ran"
            result = _run_step(executor, action, spec, made)
        else:
            parts = step_components(action, index, made)
            key, status = step_key(parts), "cached"
            hit = store.get_action(key)
            # A hit counts if its blobs can be had: here, or on the remote cache (which
            # answered it only after checking they are there).
            remote = hit is not None and hit.origin == "remote" and store.remote_usable
            if hit is not None and (remote or all(store.has_blob(e.digest)
                                                  for e in hit.outputs)):
                result = hit
            else:
                result = _run_step(executor, action, spec, made)
                store.put_components(key, parts)
                store.put_action(key, result)
                status = "ran"
        for name in spec.outputs:
            made[name] = _entries_of(name, result.outputs)
        for name, data in result.providers.items():
            if name in providers:
                raise ActionFailed(RuleError(f"two actions returned the provider "
                                             f"{name.rsplit('.', 1)[-1]}",
                                             target=str(action.label)))
            providers[name] = data
        warnings.extend(result.warnings)
        steps.append((spec.mnemonic, key, status))
    missing = [n for n in action.step_base.get("provides", []) if n not in providers]
    if missing:
        raise ActionFailed(RuleError(f"no action returned the declared provider(s) "
                                     f"{', '.join(n.rsplit('.', 1)[-1] for n in missing)}",
                                     file=action.build_file, target=str(action.label)))
    outputs = tuple(e for name in action.outputs for e in made[name])
    return Outcome(ActionResult(outputs, action.outputs, {}, tuple(warnings),
                                providers=providers), steps=tuple(steps))
