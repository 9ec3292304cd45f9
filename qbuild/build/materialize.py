"""The materializer: requested targets' outputs placed under ``qbuild-out/`` as private
read-only copies (executable where the rule made them so), restored from the store.

What was placed where is recorded (``WorkspaceState.materialized``), so a file already
in place with its recorded stat is neither copied nor hashed again. qbuild never writes
or deletes through a symlink out of its own folder.
"""

from __future__ import annotations

import os
import shutil
import stat
import time
from collections.abc import Callable
from pathlib import Path

from ..core.errors import CacheError
from ..core.files import hash_file, is_temp_name, stat_key
from ..core.labels import Label, output_folder
from ..core.protocols import Store
from ..core.records import ActionResult, OutputEntry
from ..execution.failures import ActionFailed
from ..store.gate import unsafe_name
from .state import WorkspaceState


class Materializer:
    """Places results under the output folder; remembers which files it placed."""

    def __init__(self, output_dir: Path, store: Store, state: WorkspaceState,
                 result: Callable[[Label], ActionResult],
                 rebuild: Callable[[Label], bool]) -> None:
        """``result(label)`` is a target's current result; ``rebuild(label)`` runs it
        again when stored outputs are missing or corrupt."""
        self.output_dir = output_dir
        self.store = store
        self.state = state
        self.result = result
        self.rebuild = rebuild
        self.placed: set[str] = set()  # output-folder paths of the requested targets
        # Requested targets (``place_early``) and those placed as soon as their action
        # ran: {label: (the result placed, the paths)}; the build keeps them if that is
        # still the target's result at the end.
        self.requested: set[Label] = set()
        self.early: dict[Label, tuple[ActionResult, list[str]]] = {}

    def place_early(self, label: Label, result: ActionResult) -> None:
        """Place a requested target's new outputs in the action's thread, overlapping
        the actions still running (placing 10,000 outputs one after another at the end
        was a fifth of a cold build). Anything that goes wrong is left to the placing
        at the end, which also retries by running the action again."""
        if label not in self.requested:
            return
        try:
            paths = self.place(label, rebuild=False)
        except Exception:  # noqa: BLE001 - placed (or reported) at the end instead
            return
        self.early[label] = (result, paths)

    def place(self, label: Label, rebuild: bool = True) -> list[str]:
        """Place ``label``'s outputs; returns the declared output paths (as text: a
        build of many targets prints them and needs no Path of each). If they cannot
        be placed even after running the action again (not tried unless ``rebuild``),
        raises ActionFailed (or OSError): a path is never printed for files that are not
        there."""
        base_rel = output_folder(label)
        result = self.result(label)
        _refuse_unsafe(label, result)
        if self.state.in_place(self.output_dir, base_rel, result.outputs):
            done = self.placed
            for e in result.outputs:
                done.add(f"{base_rel}/{e.path}")
            base_text = f"{self.output_dir}/{base_rel}/"
            return [base_text + name.rstrip("/") for name in result.declared]
        base, fresh = _real_dir(self.output_dir, base_rel)
        for attempt in range(2):
            result = self.result(label)
            _refuse_unsafe(label, result)
            # Each file is checked (no short cut), so every damaged blob is dropped
            # before the one rebuild.
            self.placed.update(f"{base_rel}/{e.path}" for e in result.outputs)
            placed = [self._place(base, f"{base_rel}/{e.path}", e) for e in result.outputs]
            if all(placed):
                break
            fresh = False  # this attempt's files may not be the next one's
            if attempt == 1 or not rebuild:
                raise ActionFailed(f"the outputs of {label} could not be placed in "
                                   f"{self.output_dir.name}/{base_rel}")
            self.rebuild(label)
        wanted = {e.path for e in result.outputs}
        # A folder made just now holds only what was placed (another process placing
        # the same target places the same files).
        clean = fresh or self._remove_unwanted(base, base_rel, wanted)
        if clean:
            self.state.set_folder(self.output_dir, base_rel, sorted(wanted))
        return [str(base / name.rstrip("/")) for name in result.declared]

    def _remove_unwanted(self, base: Path, base_rel: str, wanted: set[str]) -> bool:
        """Delete the files of the target's folder ``base`` that its result does not
        name; True if nothing else is left. Another qbuild process may be placing the
        same target at the same moment: its temporary copies (``core.files.temp_name``,
        renamed into place when complete) are left alone (unless untouched for
        ``_ABANDONED`` seconds: left by a killed process), and a file it removed first,
        or one that cannot be removed, is no reason to fail: the outputs are in place
        either way."""
        clean = True
        for directory, subdirs, files in os.walk(base, topdown=False):
            for name in files + [d for d in subdirs if os.path.islink(os.path.join(directory, d))]:
                path = Path(directory) / name
                rel = path.relative_to(base).as_posix()
                if rel in wanted:
                    continue
                if is_temp_name(name) and not _abandoned(path):
                    clean = False
                    continue
                try:
                    path.unlink()
                except FileNotFoundError:
                    pass
                except OSError:
                    clean = False
                    continue
                self.state.set_materialized(f"{base_rel}/{rel}", None)
        return clean

    def remove(self, label: Label) -> None:
        """Remove ``label``'s output folder (it failed or was not built)."""
        remove_owned(self.output_dir, output_folder(label))

    def _place(self, base: Path, rel: str, entry: OutputEntry) -> bool:
        path = self.output_dir / rel
        digest, executable = entry.digest, entry.executable
        if "/" in entry.path:
            real_dir(base, str(Path(entry.path).parent))
        record = self.state.materialized.get(rel)
        try:
            st: os.stat_result | None = os.lstat(path)
        except OSError:
            st = None
        if st is not None and stat.S_ISREG(st.st_mode) and record is not None and \
                record[0] == digest and record[2:] == [executable] and \
                bool(st.st_mode & stat.S_IXUSR) == executable and not st.st_mode & 0o222:
            if record[1] == stat_key(st):
                return True
            if hash_file(path) == digest:
                self.state.set_materialized(rel, [digest, stat_key(st), executable])
                return True
        if st is not None and stat.S_ISDIR(st.st_mode):
            remove_owned(self.output_dir, rel)
        if not self.store.restore_blob(digest, path, executable):
            return False
        self.state.set_materialized(rel, [digest, stat_key(os.lstat(path)), executable])
        return True


_ABANDONED = 600.0  # seconds: a copy being made is written to far more often than this


def _abandoned(path: Path) -> bool:
    try:
        return time.time() - os.lstat(path).st_mtime > _ABANDONED
    except OSError:
        return False


def _refuse_unsafe(label: Label, result: ActionResult) -> None:
    """Whoever handed over ``result`` (the local or remote store checked it when they
    read it), no file is placed outside the target's folder."""
    bad = unsafe_name(result)
    if bad is not None:
        raise ActionFailed(f"refusing to place the outputs of {label}: output path "
                           f"{bad[:80]!r} is not a relative path inside its folder")


def real_dir(top: Path, rel: str) -> Path:
    """``top/rel`` as a real directory, made so without following any symlink below
    ``top``: a symlink or file in the way is removed (it is in qbuild's own folder), so
    qbuild never writes or deletes through a link out of it."""
    return _real_dir(top, rel)[0]


def _real_dir(top: Path, rel: str) -> tuple[Path, bool]:
    """``real_dir``, and whether its last folder was made now (so holds nothing else)."""
    here = top
    made = False
    if not top.is_dir():
        top.mkdir(parents=True, exist_ok=True)
    for part in Path(rel).parts:
        if part in ("", "."):
            continue
        here = here / part
        try:
            st = os.lstat(here)
        except FileNotFoundError:
            made = _mkdir_shared(here)
            continue
        made = False
        if not stat.S_ISDIR(st.st_mode):
            here.unlink(missing_ok=True)
            made = _mkdir_shared(here)
    return here, made


def _mkdir_shared(path: Path) -> bool:
    """Make a folder another qbuild process may be making at the same moment; True if
    this call made it."""
    try:
        path.mkdir()
    except FileExistsError:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            raise
        return False
    return True


def remove_owned(top: Path, rel: str) -> None:
    """Delete ``top/rel`` (file, folder or symlink) without following symlinks."""
    here = top
    for part in Path(rel).parts[:-1]:
        here = here / part
        if here.is_symlink() or not here.is_dir():
            return  # what lies behind a link is not ours
    path = top / rel
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path, ignore_errors=True)


def clean_output_dir(output_dir: Path) -> str | None:
    """Delete what the output folder holds (``qbuild clean``). A folder is removed whole;
    a symlink to a folder (the output moved to another disk and linked back) is kept and
    the folder it points to emptied, as the user means. Returns how the result is worded
    ("qbuild-out" or "the contents of ..."), None if there was nothing; raises
    ``CacheError`` naming what could not be removed."""
    if output_dir.is_symlink():
        target = output_dir.resolve()
        if not target.is_dir():
            return None  # a dangling link: nothing of ours behind it
        shown = f"the contents of {target} (the symlink {output_dir.name} is kept)"
        for entry in list(target.iterdir()):
            remove_owned(target, entry.name)
        left = next(target.iterdir(), None)
    elif output_dir.is_dir():
        shown = output_dir.name
        shutil.rmtree(output_dir, ignore_errors=True)
        left = output_dir if output_dir.exists() else None
    else:
        return None
    if left is not None:
        raise CacheError(f"could not remove {left}: check its permissions; nothing "
                         "else is left behind")
    return shown
