"""Inputs staged as hard links to the store's blobs, and the check that makes an
in-place edit of one detected instead of silently poisoning the cache.

An action that declares ``link_inputs`` gets its dependency inputs (and its earlier
actions' outputs) as hard links to the read-only blobs when the filesystem has no
reflinks: no byte is read or written to stage them. Such a link *is* the blob, so after
the action (whether it succeeded or failed) every link's inode is stat'ed again:

- a different size, mtime or mode means it was written or chmod'ed: the blob is
  discarded from the store (no later build is served it; its producer reruns when
  needed) and the action fails, naming the input, with nothing of it cached;
- a moved ctime with size, mtime and mode unchanged (another process linked or
  unlinked the same blob, or something wrote it and set its mtime back) is settled by
  hashing the file, unless this process itself made that ctime (``Store.trusts``);
- a blob last written in the same clock tick as it was linked (a later write could keep
  its mtime) is hashed too.

Any other action that had the same blob linked meanwhile, in this process or another
one, runs the same check before it commits, and the shared inode shows it the change.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..core.files import granularity, hash_file

if TYPE_CHECKING:
    from ..core.protocols import Store

_REPLACED = "another file was put in its place"


@dataclass
class Linked:
    """One staged link: where it is, the blob it is, and its stat right after linking."""

    dest: Path
    blob: Path
    digest: str
    stat: os.stat_result


def stage_link(store: Store, digest: str, dest: Path, linked: list[Linked]) -> bool:
    """Link the blob at ``dest`` if the store can (False: stage a copy instead)."""
    made = store.link_blob(digest, dest)
    if made is None:
        return False
    linked.append(Linked(dest, made[0], digest, made[1]))
    return True


def _inode_stat(item: Linked) -> tuple[Path, os.stat_result] | None:
    """A path to the linked inode and its stat now, wherever it still has a name we know
    (the rule may have moved its input, e.g. into its outputs)."""
    for path in (item.dest, item.blob):
        try:
            st = os.stat(path)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (item.stat.st_dev, item.stat.st_ino):
            return path, st
    return None


def _replaced(item: Linked) -> bool:
    """Is something else than the link now at its path, with other bytes? (The rule
    may have read that instead of its input.) Moved away or deleted is no harm."""
    try:
        st = os.lstat(item.dest)
    except OSError:
        return False
    if (st.st_dev, st.st_ino) == (item.stat.st_dev, item.stat.st_ino):
        return False
    try:
        return not stat.S_ISREG(st.st_mode) or hash_file(item.dest) != item.digest
    except OSError:
        return True


def _later_tick(pre: os.stat_result) -> bool:
    """Was the link made in a later clock tick than the blob's last write? Then any write
    after linking gives it a different mtime (both stamps come from the same clock, cut
    to the filesystem's granularity). With whole-second stamps the granularity may be 2 s
    (FAT), so the stamps must be that far apart."""
    step = granularity(pre.st_mtime_ns, pre.st_ctime_ns)
    if step >= 1:
        return pre.st_ctime_ns - pre.st_mtime_ns >= step * 1e9
    return pre.st_ctime_ns > pre.st_mtime_ns


def _fields(st: os.stat_result | None) -> tuple[int, ...] | None:
    if st is None:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode)


def modified(store: Store, items: list[Linked]) -> list[tuple[Linked, str, bool]]:
    """The links whose blob may have changed or whose path holds another file now, each
    with why and whether its blob was discarded from the store. Empty: every input is
    the blob it was, as it was when linked."""
    bad: list[tuple[Linked, str, bool]] = []
    for item in items:
        why = _changed(store, item)
        if why is not None:
            bad.append((item, why, why != _REPLACED))
    return bad


def _changed(store: Store, item: Linked) -> str | None:
    """Why the blob linked as ``item`` may have changed (then it is discarded from the
    store), or why the input at its path is not the blob any more, or None."""
    pre = item.stat
    for _attempt in range(3):  # another action's link or unlink may move the ctime
        found = _inode_stat(item)
        if found is None:
            return "it was moved and its blob replaced meanwhile"
        path, st = found
        if (st.st_size, st.st_mtime_ns, st.st_mode) != (pre.st_size, pre.st_mtime_ns,
                                                        pre.st_mode):
            why = "it was written to" if st.st_mode == pre.st_mode else "its mode changed"
            break
        if (st.st_ctime_ns == pre.st_ctime_ns or store.trusts(item.digest, st)) and \
                _later_tick(pre):
            return _REPLACED if _replaced(item) else None
        try:
            same = hash_file(path) == item.digest
            now = _inode_stat(item)
        except OSError:
            continue
        if not same:
            why = "its bytes changed"
            break
        if now is not None and _fields(now[1]) == _fields(st):
            store.vouch(item.digest, st)
            return _REPLACED if _replaced(item) else None
    else:
        why = "it kept changing while it was checked"
    store.discard_blob(item.digest, (pre.st_dev, pre.st_ino))
    return why


def release(store: Store, items: list[Linked], intact: bool) -> None:
    """Remove the links (before the sandbox goes to background deletion), so this
    process knows the ctime its own unlink left on each blob and other actions reading
    the same blob need not hash it again."""
    for item in items:
        try:
            st = os.stat(item.dest)
            if (st.st_dev, st.st_ino) != (item.stat.st_dev, item.stat.st_ino):
                continue
            trusted = intact and store.trusts(item.digest, st)
            os.unlink(item.dest)
            if trusted:
                after = os.stat(item.blob)
                if (after.st_ino, after.st_size, after.st_mtime_ns, after.st_mode) == (
                        st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode):
                    store.vouch(item.digest, after)
        except OSError:
            continue
