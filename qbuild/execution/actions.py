"""Running a v2 target: its declared actions in order, each cached on its own key.

A v2 target is scheduled as one unit (its target key, as for v1 rules, answers a no-op
build with one lookup). When that key misses, each declared action is keyed from its own
parts only (function and code, params, output names, the content of its inputs, never
the label: ``keys.action_keys``) and looked up; only the actions whose key misses run,
each in a sandbox of its own (``sandbox.Sandboxes``) holding just its inputs (a
dependency under ``<attribute>.dep`` or ``<attribute>.dep<index>/``, sources under
``<attribute>.src/<path in the package>``, earlier outputs under ``made/``; a declared
layout under ``ws/``): flat, because every folder costs a ``mkdir`` and an ``rmdir``;
the text after the last dot tells the folders of one attribute, and of different
attributes, apart.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import stat
import time
from pathlib import Path
from typing import Any

from ..analysis.workspace import BUILD_FILE
from ..api.actions import FORWARD_FILES, ActionSpec, RunContext, resolve_function
from ..api.providers import returned_providers
from ..api.rule import RUN_RULE, Dep
from ..core import live
from ..core.errors import QbuildError, RuleError
from ..core.files import hash_file, stat_key
from ..core.labels import OUT_PREFIX, output_folder, parse_label
from ..core.records import ActionResult, Outcome, OutputEntry, TargetActions
from ..keys.action_keys import Made, declared_action_key, declared_action_parts, package_path
from ..store.gate import unsafe_name
from .failures import ActionFailed, MissingBlob, log_tail
from .linked import Linked, release, stage_link
from .sandbox import Sandboxes, SandboxFolders

_names = itertools.count()  # names of forwarded copies (next() is atomic under the GIL)


def _entries_of(name: str, entries: tuple[OutputEntry, ...]) -> list[OutputEntry]:
    if name.endswith("/"):
        return [e for e in entries if e.path.startswith(name)]
    return [e for e in entries if e.path == name]


def plan_actions(store: Any, action: TargetActions) -> list[dict[str, Any]]:
    """Each declared action's key as far as it can be known without running anything
    (an action after one that is not cached has no key yet), and whether it is cached."""
    made: Made = {}
    out = []
    for index, spec in enumerate(action.actions):
        if any(name not in action.attr_types and name not in made for name in spec.inputs):
            out.append({"spec": spec, "key": None, "cached": False})
            continue
        key = declared_action_key(declared_action_parts(action, index, made))
        cached = store.get_action(key)
        if cached is not None:
            for name in spec.outputs:
                made[name] = _entries_of(name, cached.outputs)
        out.append({"spec": spec, "key": key, "cached": cached is not None})
    return out


def _invoke_step(rule_ref: str, function: str, ctx: RunContext, out_root: Path
                 ) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
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
    if info and function != RUN_RULE:
        raise RuleError(f"action {function} returned an info dict; actions return "
                        "providers")
    return info or {}, providers, ctx.warnings


def workspace_name(action: TargetActions, rel: str) -> str:
    """A path inside an action's sandbox as the user knows it: a dependency's output
    under ``qbuild-out/``, a source by its workspace path, an earlier action's output
    under the target's own folder (``rel`` as it is when it is none of these)."""
    head, _, rest = rel.partition("/")
    name, dot, kind = head.rpartition(".")
    if head == "made":
        return f"{OUT_PREFIX}/{output_folder(action.label)}/{rest}"
    if not dot or name not in action.attrs or not rest:
        return rel
    value = action.attrs[name]
    if kind == "src":
        package = action.label.package
        return f"{package}/{rest}" if package else rest
    if kind.startswith("dep"):
        items = value if isinstance(value, list) else [value]
        index = int(kind[3:] or 0) if kind[3:].isdigit() or not kind[3:] else -1
        if 0 <= index < len(items) and str(items[index]).startswith("//"):
            dep = action.deps.get(items[index])
            forwarded = dep.sources.get(rest) if dep is not None else None
            return forwarded or f"{OUT_PREFIX}/{output_folder(items[index])}/{rest}"
    return rel


def _place(sandboxes: Sandboxes, entry: OutputEntry, dest: Path,
           staged: dict[Path, tuple[str, str]], linked: list[Linked] | None) -> bool:
    """Stage one blob at ``dest``: a hard link if the action allows it (and the blob is
    not executable: a link shares the blob's mode), else a verified private copy."""
    if dest in staged or (linked and any(item.dest == dest for item in linked)):
        return True  # the same output listed twice
    if linked is not None and not entry.executable and \
            stage_link(sandboxes.store, entry.digest, dest, linked):
        return True
    if not sandboxes.store.restore_blob(entry.digest, dest, entry.executable):
        return False
    staged[dest] = (entry.digest, stat_key(os.lstat(dest)))
    return True


def _stage_dep(sandboxes: Sandboxes, label: str, dep: ActionResult, base: Path,
               staged: dict[Path, tuple[str, str]], linked: list[Linked] | None = None,
               dirs: SandboxFolders | None = None) -> Dep:
    bad = unsafe_name(dep)
    if bad is not None:  # whoever handed this result over: nothing is staged outside
        raise ActionFailed(RuleError(f"refusing to stage the outputs of {label}: output "
                                     f"path {bad[:80]!r} is not a relative path inside "
                                     "its folder"), started=False)
    for entry in dep.outputs:
        dest = base / entry.path
        if dirs is not None:
            dirs.make(dest.parent)
        if not _place(sandboxes, entry, dest, staged, linked):
            raise MissingBlob(label)
    if dirs is not None:
        dirs.make(base)
    else:
        base.mkdir(parents=True, exist_ok=True)
    files = [base / name.rstrip("/") for name in dep.declared]
    return Dep("", files, dict(dep.info), base, dep.digests(), dict(dep.providers),
               dep.failed)


def _stage_item(sandboxes: Sandboxes, action: TargetActions, item: str, base: Path, index: int,
                staged: dict[Path, tuple[str, str]], origins: list[tuple[int, str]],
                at: Path | None = None, linked: list[Linked] | None = None,
                dirs: SandboxFolders | None = None) -> list[Path]:
    """Stage one item of a file/files attribute (at ``at`` if the action's layout
    says where)."""
    if item.startswith("//"):
        dep = action.deps[item]
        files = _stage_dep(sandboxes, item, dep,
                           at or base.with_name(f"{base.name}.dep{index}"), staged,
                           linked, dirs).files
        origins.extend((index, name.rstrip("/")) for name in dep.declared)
        return files
    rel = package_path(action, item)
    dest = at or base.with_name(f"{base.name}.src") / rel
    if dirs is not None:
        dirs.make(dest.parent)
    else:
        dest.parent.mkdir(parents=True, exist_ok=True)
    digest, key = action.sources[item]
    if dest not in staged:  # (an item listed twice is staged once)
        staged[dest] = (digest, sandboxes.stage_source(action, item, key, dest))
    origins.append((index, rel))
    return [dest]


def _stage(sandboxes: Sandboxes, action: TargetActions, spec: ActionSpec, sandbox: Path,
           made: Made, log_path: Path, linked: list[Linked], dirs: SandboxFolders
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
                if not _place(sandboxes, entry, dest, staged, links):
                    raise _MadeMissing(name)
            inputs[name] = sandbox / "made" / name.rstrip("/")
            continue
        value = action.attrs[name]
        if value is None:
            inputs[name] = None
        elif kind == "label":
            inputs[name] = _stage_dep(sandboxes, value, action.deps[value],
                                      base.with_name(f"{name}.dep"), staged, links, dirs)
        elif kind == "label_list":
            inputs[name] = [_stage_dep(sandboxes, v, action.deps[v],
                                       base.with_name(f"{name}.dep{i}"), staged, links, dirs)
                            for i, v in enumerate(value)]
        elif kind == "file":
            origins[name] = []
            files = _stage_item(sandboxes, action, value, base, 0, staged, origins[name],
                                root / layout[0] if layout else None, links, dirs)
            if len(files) != 1:  # as Dep.file: a file attribute names one file
                raise RuleError(f"the target given as '{name}' has {len(files)} outputs; "
                                "expected exactly one", attr=name)
            inputs[name] = files[0]
        else:
            origins[name] = []
            inputs[name] = [path for i, item in enumerate(value)
                            for path in _stage_item(sandboxes, action, item, base, i, staged,
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
                     root=root, names=functools.partial(workspace_name, action),
                     dep_targets=_dep_targets(action, spec))
    return ctx, staged


def _dep_targets(action: TargetActions, spec: ActionSpec) -> dict[str, tuple[str, str]]:
    """For each ``label`` input of the action: the label and BUILD file of the target
    it names (where ``RunContext.fail_at`` locates an error that target causes)."""
    out = {}
    for name in spec.inputs:
        value = action.attrs.get(name) if action.attr_types.get(name) == "label" else None
        if isinstance(value, str) and value.startswith("//"):
            package = parse_label(value).package
            out[name] = (value, f"{package}/{BUILD_FILE}" if package else BUILD_FILE)
    return out


def _forwardable(action: TargetActions, spec: ActionSpec) -> list[tuple[str, str]] | None:
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


def _forward(sandboxes: Sandboxes, action: TargetActions, spec: ActionSpec,
             pairs: list[tuple[str, str]]) -> ActionResult:
    """Run ``forward_files`` over source files without a sandbox or a call: each source
    is copied (read-only, checked against the stat its digest was taken with, before
    and after) into a private folder of the store's ``tmp/`` and moved into the store
    as the output's blob; nothing else runs, so there is nothing else to check."""
    folder = sandboxes.forward_dir()
    entries = []
    for item, name in pairs:
        digest, key = action.sources[item]
        temp = folder / str(next(_names))  # (unique: a file left behind is in no one's way)
        copied = sandboxes.copy_source(action, item, key, temp)
        adopted = False
        try:
            adopted = sandboxes.store.put_blob(temp, digest, adopt=True, hashed=copied)
        finally:
            if not adopted:  # an intact copy was there already (or storing failed)
                temp.unlink(missing_ok=True)
        entries.append(OutputEntry(name, digest, copied.st_size,
                                   bool(copied.st_mode & stat.S_IXUSR)))
    sandboxes.check_sources(action)
    return ActionResult(tuple(entries), tuple(spec.outputs), {}, (), providers={},
                        sources={name: item for item, name in pairs})


def _run_step(sandboxes: Sandboxes, action: TargetActions, spec: ActionSpec,
              made: Made) -> ActionResult:
    if spec.function == FORWARD_FILES:
        pairs = _forwardable(action, spec)
        if pairs is not None:
            return _forward(sandboxes, action, spec, pairs)
    box = sandboxes.open(reuse=True)
    log_path = box.path / LOG_NAME  # made by the first log line (opened "a")
    linked: list[Linked] = []
    intact = False
    try:
        ctx, staged = _stage(sandboxes, action, spec, box.path, made, log_path, linked,
                             box.folders)
        out_root = box.path / "out"
        failed: ActionFailed | None = None
        live.watch(str(action.label), box.path / live.PROGRESS_NAME)
        try:
            if spec.heavy:
                info, providers, warnings = sandboxes.run_in_worker(
                    action, log_path, _invoke_step, action.rule_ref, spec.function, ctx,
                    out_root)
            else:
                info, providers, warnings = _invoke_step(action.rule_ref, spec.function, ctx,
                                                   out_root)
        except QbuildError as exc:
            located = exc.located(file=action.build_file, target=str(action.label))
            if len(action.actions) > 1:  # say which one
                located.message = f"action {spec.mnemonic}: {located.message}"
            failed = ActionFailed(located, log_tail(log_path))
        finally:
            live.forget(str(action.label))
        # Failed or not: a linked input written to is the cache's blob, discarded here.
        sandboxes.check_linked_inputs(action, box.path, linked)
        intact = True
        if failed is not None:
            raise failed
        sandboxes.check_staged_inputs(action, box.path, staged,
                                      lambda rel: workspace_name(action, rel))
        for item in linked:
            staged.setdefault(item.dest, (item.digest, stat_key(item.stat)))
        entries = sandboxes.collect_outputs(
            action, out_root, log_path, tuple(spec.outputs),
            forwarded=staged if spec.function == FORWARD_FILES else None)
        sandboxes.check_sources(action)
        return ActionResult(tuple(entries), tuple(spec.outputs), info, tuple(warnings),
                            providers=providers, log=_keep_log(sandboxes.store, log_path))
    finally:
        release(sandboxes.store, linked, intact)
        sandboxes.discard(box)


LOG_NAME = "_action.log"


def _keep_log(store: Any, log_path: Path) -> OutputEntry | None:
    """Store a successful action's log as a blob and return its reference (None if it
    wrote none). The file is given to the store as an output is (moved, and written
    with the entry's batch): the sandbox is discarded next."""
    try:
        st = log_path.stat()
    except FileNotFoundError:
        return None
    if not st.st_size:
        return None
    digest = hash_file(log_path)
    store.put_blob(log_path, digest, adopt=True, hashed=st)
    return OutputEntry(LOG_NAME, digest, st.st_size)


class _MadeMissing(Exception):
    """An earlier action's cached output could not be restored (its blob is gone)."""


def execute_actions(sandboxes: Sandboxes, action: TargetActions) -> Outcome:
    """Run a v2 target: each declared action in order, served from the cache when its
    own key hits (with every blob present), run otherwise, in sandboxes of
    ``sandboxes``."""
    started = time.monotonic()
    # A blob found missing while staging is dropped from the store's index, so going
    # through the actions again runs the one that made it.
    for _attempt in range(len(action.actions)):
        try:
            outcome = _execute_each(sandboxes, action)
            break
        except _MadeMissing:
            continue
    else:
        raise ActionFailed(RuleError("the outputs of its earlier actions could not be "
                                     "restored from the cache", target=str(action.label)))
    return Outcome(outcome.result, time.monotonic() - started, actions=outcome.actions)


def _run_step_after(steps: list[tuple[str, str, str]], sandboxes: Sandboxes,
                    action: TargetActions,
                    spec: ActionSpec, made: Made) -> ActionResult:
    """``_run_step``, after the target's ``steps`` so far: a failure before this step
    started still counts as the target having run when an earlier step ran."""
    try:
        return _run_step(sandboxes, action, spec, made)
    except ActionFailed as exc:
        if any(status == "ran" for _, _, status in steps):
            exc.started = True
        raise


def _execute_each(sandboxes: Sandboxes, action: TargetActions) -> Outcome:
    store = sandboxes.store
    made: Made = {}
    providers: dict[str, Any] = {}
    info: dict[str, Any] = {}  # (only a ``run`` rule's action returns one)
    sources: dict[str, str] = {}  # outputs forwarded from sources (a filegroup's)
    warnings: list[str] = []
    steps: list[tuple[str, str, str]] = []
    for index, spec in enumerate(action.actions):
        if action.keyed_by_action:
            # The target's key is this action's: the caller looked it up (a miss) and
            # stores the result under it.
            key, status = action.key, "ran"
            result = _run_step_after(steps, sandboxes, action, spec, made)
        else:
            parts = declared_action_parts(action, index, made)
            key, status = declared_action_key(parts), "cached"
            hit = store.get_action(key)
            # A hit counts if its blobs can be had: here, or on the remote cache (which
            # answered it only after checking they are there).
            remote = hit is not None and hit.origin == "remote" and store.remote_usable
            if hit is not None and (remote or all(store.has_blob(e.digest)
                                                  for e in hit.outputs)):
                result = hit
            else:
                result = _run_step_after(steps, sandboxes, action, spec, made)
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
        info.update(result.info)
        sources.update(result.sources)
        steps.append((spec.mnemonic, key, status))
    missing = [n for n in action.action_base.get("provides", []) if n not in providers]
    if missing:
        raise ActionFailed(RuleError(f"no action returned the declared provider(s) "
                                     f"{', '.join(n.rsplit('.', 1)[-1] for n in missing)}",
                                     file=action.build_file, target=str(action.label)))
    outputs = tuple(e for name in action.outputs for e in made[name])
    # keyed by its one action: the target's entry is that action's, log included
    log = result.log if action.keyed_by_action else None
    return Outcome(ActionResult(outputs, action.outputs, info, tuple(warnings),
                                providers=providers, log=log, sources=sources),
                   actions=tuple(steps))
