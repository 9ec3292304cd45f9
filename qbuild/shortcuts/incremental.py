"""The incremental path: a build after a few source edits keys only what they affect.

After a successful build whose analysis came from (or went into) the analysis cache
(``_analysis_cache``), a record keeps, for each target, the key it was built with, its
result (as the action cache holds it) and the stat of each source file as its digest was
taken. The next build of the same request, if its analysis is that very record's
(same analysis cache entry, reused unchanged) and everything else a key rests on is
unchanged (the interpreter and ``sys.path`` fingerprint, the command-line settings,
every loaded module and every rule code file, by stat), reuses a target's key and result
without computing either when

- every source file of it has the stat its digest was taken with,
- every dependency's result contributes to a key exactly what it contributed then
  (``_keys.dep_part``): a dependency rebuilt to the same bytes (early cutoff) still
  counts as unchanged, and
- the action cache still holds that key with that very result (checked for all targets
  in a few SQL queries, not one lookup each).

Then the full path would compute the same key and find the same result, so the answer is
the same; any doubt (a stat too recent to vouch for the bytes read, a missing or damaged
record, a remote cache, a rebuilt dependency during the last build) keys the target the
usual way. ``--explain`` always takes the full path.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.files import key_is_racy, stat_key
from ..core.labels import Label
from ..core.records import ActionResult
from ..keys import environ
from ..keys.parts import dep_part, sorted_json
from .noop import same_environment, with_reads

if TYPE_CHECKING:
    from ..core.protocols import Store

_VERSION = 2
_UNSEEN: Any = object()


def record_path(output_dir: Path, patterns: list[str], package: str | None) -> Path:
    request = json.dumps([patterns, package])
    name = hashlib.sha256(request.encode()).hexdigest()[:24]
    return output_dir / ".qbuild" / "incremental" / f"{name}.json"


def _stat(path: str) -> str | None:
    try:
        return stat_key(os.stat(path))
    except OSError:
        return None


def _code_files(code_files: Iterable[str]) -> dict[str, str | None]:
    files = {file: _stat(file) for file in code_files}
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if file and file not in files:
            files[file] = _stat(file)
    return files


def result_text(result: ActionResult) -> str:
    """A result as the action cache stores it (``Store.put_action``): the very
    text it was read from, when the store kept it."""
    text = result.__dict__.get("_text")
    return text if isinstance(text, str) else sorted_json(result.to_json())


class Reuse:
    """The last build's keys and results, for the targets whose inputs are unchanged."""

    def __init__(self, root: Path, targets: dict[str, list[Any]], present: set[str],
                 code_files: list[str]) -> None:
        self.root = root
        self.code_files = code_files  # rule code the recorded keys rest on
        self._targets = targets  # label -> [key, result text, {rel: [digest, stat]} | None]
        self._present = present  # keys the action cache holds with the recorded result
        self._results: dict[str, ActionResult] = {}
        self.reused = 0

    @classmethod
    def load(cls, path: Path, root: Path, analysis: str | None, env: Mapping[str, Any],
             store: Store) -> Reuse | None:
        """The record at ``path`` if it was made over analysis ``analysis`` and nothing
        else a key rests on changed; None otherwise (then every target is keyed)."""
        if analysis is None:
            return None
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            if record.get("version") != _VERSION or record["analysis"] != analysis or \
                    not same_environment(record["env"], env) or \
                    record["store"] != str(store.directory):
                return None
            for file, key in record["files"].items():
                if _stat(file) != key:
                    return None
            targets, code_files = record["targets"], record["code_files"]
            if not isinstance(targets, dict) or not isinstance(code_files, list) or \
                    not all(isinstance(file, str) for file in code_files):
                return None
            wanted = {entry[0]: entry[1] for entry in targets.values()}
            stored = store.action_texts(list(wanted))
        except (OSError, ValueError, TypeError, KeyError, IndexError, AttributeError):
            return None
        present = {key for key, text in stored.items() if wanted.get(key) == text}
        environ.carry(record["env"]["environ"])  # the facts of targets reused unasked
        return cls(root, targets, present, code_files)

    def _result(self, label: str) -> ActionResult | None:
        result = self._results.get(label)
        if result is None:
            entry = self._targets.get(label)
            if entry is None:
                return None
            result = ActionResult.from_json(json.loads(entry[1]))
            self._results[label] = result
        return result

    def entry_of(self, label: str, key: str, result: ActionResult) -> list[Any] | None:
        """The recorded entry of ``label`` if the build reused it as recorded (the same
        key and the very result object decoded from it, with source stats): what
        ``save`` would make of it again. Its stats were not too recent for the build
        that recorded them, so neither for this later one."""
        entry = self._targets.get(label)
        if entry is None or entry[0] != key or entry[2] is None or \
                self._results.get(label) is not result:
            return None
        return list(entry)

    def text(self, label: str, result: ActionResult) -> str:
        """``result_text(result)``, without encoding it again if it is the recorded one."""
        if self._results.get(label) is result:
            return str(self._targets[label][1])
        return result_text(result)

    def untouched(self, order: Iterable[Label], targets: Mapping[Label, Any]
                  ) -> dict[Label, tuple[str, ActionResult, dict[str, tuple[str, str]]]]:
        """(key, result, sources) of every target ``take`` would reuse whose
        dependencies are all reused unchanged too (so each gets the very result object
        ``take`` compares with): its own entry and source stats are all that decide it.
        ``order`` lists dependencies first. Each source file is stat'ed once. The build
        gives these targets their results without planning or keying them; the others
        (an edited source, a group, a dependency that may come back different) go
        through the plan and ``take`` as usual."""
        chosen: dict[Label, tuple[str, dict[str, tuple[str, str]]]] = {}
        stats: dict[str, str | None] = {}
        root = str(self.root) + os.sep
        for label in order:
            target = targets[label]
            if target.is_group:
                continue  # (``take`` never reuses a target depending on a group)
            entry = self._targets.get(str(label))
            if entry is None or entry[2] is None or entry[0] not in self._present:
                continue
            if not all(dep in chosen for dep in target.deps):
                continue
            try:
                sources: dict[str, tuple[str, str]] = {}
                for rel, (digest, key) in entry[2].items():
                    now = stats.get(rel, _UNSEEN)
                    if now is _UNSEEN:
                        now = stats[rel] = _stat(root + rel)
                    if now != key:
                        break
                    sources[rel] = (digest, key)
                else:
                    chosen[label] = (entry[0], sources)
            except (ValueError, TypeError, KeyError, AttributeError):
                continue
        if not self._decode([str(label) for label in chosen]):
            return {}  # a damaged result: ``take`` decides target by target
        found = {label: (key, self._results[str(label)], sources)
                 for label, (key, sources) in chosen.items()}
        self.reused += len(found)
        return found

    def _decode(self, labels: list[str]) -> bool:
        """Decode the recorded results of ``labels`` (in one pass: one JSON array);
        False if one of them cannot be."""
        names = [name for name in labels if name not in self._results]
        try:
            texts = [self._targets[name][1] for name in names]
            if not all(isinstance(text, str) for text in texts):
                return False
            values = json.loads("[" + ",".join(texts) + "]")
            if not isinstance(values, list) or len(values) != len(names):
                return False
            made = [ActionResult.from_json(value) for value in values]
        except (ValueError, TypeError, KeyError, AttributeError, IndexError):
            return False
        self._results.update(zip(names, made))
        return True

    def take(self, label: Label, deps: list[Label], results: Mapping[Label, ActionResult]
             ) -> tuple[str, ActionResult, dict[str, tuple[str, str]]] | None:
        """(key, result, sources as digested) of ``label`` if the last build's may be
        reused, else None."""
        name = str(label)
        entry = self._targets.get(name)
        if entry is None or entry[2] is None or entry[0] not in self._present:
            return None
        try:
            for dep in deps:
                now, then = results.get(dep), self._result(str(dep))
                if now is None or then is None:
                    return None
                if now is not then and dep_part(now) != dep_part(then):
                    return None
            sources: dict[str, tuple[str, str]] = {}
            root = str(self.root) + os.sep
            for rel, (digest, key) in entry[2].items():
                if _stat(root + rel) != key:
                    return None
                sources[rel] = (digest, key)
            result = self._result(name)
        except (ValueError, TypeError, KeyError, AttributeError):
            return None
        if result is None:
            return None
        self.reused += 1
        return entry[0], result, sources


def save(path: Path, *, analysis: str | None, env: Mapping[str, Any], store_dir: Path,
         started: float, code_files: Iterable[str],
         targets: Mapping[str, tuple[str, ActionResult, Mapping[str, tuple[str, str]]]],
         reuse: Reuse | None = None) -> None:
    """Record a successful build's keys, results and source stats (best effort). A
    target whose sources' stats are too recent to vouch for the bytes read is recorded
    without them (never reused, but its result still tells its dependents' checks)."""
    if analysis is None or not targets:
        forget(path)
        return
    code_files = sorted(code_files)
    files = _code_files(code_files)
    if any(key is not None and key_is_racy(key, started) for key in files.values()):
        forget(path)
        return
    entries = {}
    for label, (key, result, sources) in targets.items():
        if reuse is not None:
            same = reuse.entry_of(label, key, result)
            if same is not None:  # reused as recorded: recorded as it was
                entries[label] = same
                continue
        stats: dict[str, list[str]] | None = {
            rel: [digest, stat] for rel, (digest, stat) in sources.items()}
        if any(key_is_racy(stat, started) for _digest, stat in sources.values()):
            stats = None
        text = reuse.text(label, result) if reuse is not None else result_text(result)
        entries[label] = [key, text, stats]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        temp.write_text(json.dumps({"version": _VERSION, "analysis": analysis,
                                    "env": with_reads(env),
                                    "store": str(store_dir), "files": files,
                                    "code_files": code_files,
                                    "targets": entries}), encoding="utf-8")
        os.replace(temp, path)
    except (OSError, TypeError, ValueError):
        forget(path)


def forget(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass
