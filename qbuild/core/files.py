"""Content digests (SHA-256, the digest Bazel's remote cache speaks) and the persistent
stat memo that lets a no-op build hash zero bytes.

The memo maps (device, inode, size, mtime_ns, ctime_ns) to a digest. ctime is part of
the key because an in-place edit that restores the mtime still moves the ctime, which
no user tool can set back. A file changed within the filesystem's timestamp granularity
is "racy" and never memoised: a second edit in the same tick could keep every stat field
equal. The granularity is read off the timestamps themselves: whole-second stamps mean a
1-2 s filesystem (ext2/3 with small inodes, FAT, some NFS/FUSE mounts), anything finer the
kernel's coarse clock tick (bounded below by 50 ms to stay conservative). The memo
itself is the store's: ``store.digests.SourceDigests`` takes each source's digest
through it, with these functions.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import threading
from pathlib import Path
from typing import Any

_CHUNK = 1 << 20
_FINE_GRANULARITY = 0.05
_COARSE_GRANULARITY = 2.0  # FAT rounds to 2 s; 1 s filesystems are covered too
_SECOND_NS = 1_000_000_000


def granularity(mtime_ns: int, ctime_ns: int) -> float:
    """Seconds two writes may be apart and still get the same timestamps."""
    if mtime_ns % _SECOND_NS == 0 and ctime_ns % _SECOND_NS == 0:
        return _COARSE_GRANULARITY
    return _FINE_GRANULARITY


def is_racy(mtime_ns: int, ctime_ns: int, since: float) -> bool:
    """True if a file with these stamps may have changed at or after time ``since``
    (seconds since the epoch) without its stat showing it."""
    newest = max(mtime_ns, ctime_ns) / _SECOND_NS
    return newest >= since - granularity(mtime_ns, ctime_ns)


def key_is_racy(key: str, since: float) -> bool:
    """``is_racy`` for a stat key made by ``stat_key``."""
    fields = key.split(":")
    return is_racy(int(fields[3]), int(fields[4]), since)


def hash_file(path: str | os.PathLike[str]) -> str:
    """SHA-256 of a file, streamed in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


_FICLONE = 0x40049409  # linux/fs.h: share the source's extents (btrfs, XFS, bcachefs)
_NO_REFLINK: set[int] = set()


def clone_or_copy(source: str | os.PathLike[str], dest: str | os.PathLike[str]) -> None:
    """Make ``dest`` a private copy of ``source``: a reflink where the filesystem can
    (no data read or written; a later write to either file unshares it), else a copy."""
    device = os.stat(source).st_dev
    if device not in _NO_REFLINK:
        try:
            import fcntl

            with open(source, "rb") as src, open(dest, "wb") as dst:
                fcntl.ioctl(dst.fileno(), _FICLONE, src.fileno())
            return
        except (OSError, ImportError):
            _NO_REFLINK.add(device)  # do not ask this filesystem again
    import shutil

    shutil.copyfile(source, dest)


_REFLINK_PROBED: dict[int, bool] = {}


def has_reflinks(directory: str | os.PathLike[str]) -> bool:
    """Can files in ``directory`` be cloned (``FICLONE``)? Probed once per filesystem
    with two empty files, so a private copy's cost is known before the first one."""
    device = os.stat(directory).st_dev
    known = _REFLINK_PROBED.get(device)
    if known is not None:
        return known
    if device in _NO_REFLINK:
        _REFLINK_PROBED[device] = False
        return False
    base = os.path.join(directory, f".reflink-probe-{os.getpid()}-{threading.get_ident()}")
    able = False
    try:
        import fcntl

        with open(base + ".a", "w+b") as src:  # FICLONE reads the source: not "wb"
            src.write(b"x")
            src.flush()
            with open(base + ".b", "wb") as dst:
                fcntl.ioctl(dst.fileno(), _FICLONE, src.fileno())
        able = True
    except (OSError, ImportError):
        pass
    finally:
        for name in (base + ".a", base + ".b"):
            try:
                os.unlink(name)
            except OSError:
                pass
    _REFLINK_PROBED[device] = able
    return able


def copy_new(source: str | os.PathLike[str], dest: str | os.PathLike[str],
             executable: bool | None = None
             ) -> tuple[os.stat_result, os.stat_result, os.stat_result]:
    """Copy ``source`` to a new file ``dest``, created read-only (``0555`` if
    ``executable``, by default if the source is executable by its owner, else ``0444``):
    a clone where the filesystem can, else ``sendfile``. Returns the source's stat when
    opened and after the copy (a caller compares them with what it expects), and the
    copy's stat. Few system calls: this runs for every staged input and placed output."""
    before, after, copied, _ = _copy_new(source, dest, executable, None)
    return before, after, copied


def copy_new_hashing(source: str | os.PathLike[str], dest: str | os.PathLike[str]
                     ) -> tuple[os.stat_result, os.stat_result, os.stat_result, str]:
    """``copy_new``, also returning the SHA-256 of the bytes copied: the copy reads
    them once through user space (no clone, no ``sendfile``) and they are hashed on the
    way, so a digest taken on trust (a memo) is checked without a second read."""
    before, after, copied, digest = _copy_new(source, dest, None, hashlib.sha256())
    assert digest is not None
    return before, after, copied, digest


def _copy_new(source: str | os.PathLike[str], dest: str | os.PathLike[str],
              executable: bool | None, hasher: Any
              ) -> tuple[os.stat_result, os.stat_result, os.stat_result, str | None]:
    src = os.open(source, os.O_RDONLY | os.O_CLOEXEC)
    try:
        before = os.fstat(src)
        if executable is None:
            executable = bool(before.st_mode & stat.S_IXUSR)
        mode = 0o555 if executable else 0o444
        dst = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
        try:
            if hasher is None:
                _transfer(src, dst, before)
            else:
                _transfer_hashing(src, dst, hasher)
            copied = os.fstat(dst)
            if stat.S_IMODE(copied.st_mode) != mode:  # a umask took bits away
                os.fchmod(dst, mode)
                copied = os.fstat(dst)
        except BaseException:
            os.close(dst)
            try:
                os.unlink(dest)
            except OSError:
                pass
            raise
        os.close(dst)
        after = os.fstat(src)
    finally:
        os.close(src)
    return before, after, copied, None if hasher is None else hasher.hexdigest()


def _transfer_hashing(src: int, dst: int, hasher: Any) -> None:
    buffer = bytearray(_CHUNK)
    view = memoryview(buffer)
    while read := os.readv(src, [buffer]):
        hasher.update(view[:read])
        written = 0
        while written < read:
            written += os.write(dst, view[written:read])


def _transfer(src: int, dst: int, st: os.stat_result) -> None:
    if st.st_size == 0:
        return
    if _REFLINK_PROBED.get(st.st_dev) is not False and st.st_dev not in _NO_REFLINK:
        try:
            import fcntl

            fcntl.ioctl(dst, _FICLONE, src)
            return
        except (OSError, ImportError):
            _NO_REFLINK.add(st.st_dev)
    offset = 0
    while offset < st.st_size:
        sent = os.sendfile(dst, src, offset, st.st_size - offset)
        if sent == 0:
            break  # shorter than it was: the caller's stat check sees it
        offset += sent


def copy_hashing(source: str | os.PathLike[str], dest: str | os.PathLike[str]) -> str:
    """Copy ``source`` to a new file ``dest`` and return the SHA-256 of what was copied
    (one read of the source for both)."""
    digest = hashlib.sha256()
    with open(source, "rb") as src, open(dest, "xb") as dst:
        while chunk := src.read(_CHUNK):
            digest.update(chunk)
            dst.write(chunk)
    return digest.hexdigest()


def temp_name(dest: Path) -> Path:
    """Where a copy bound for ``dest`` is written before it is renamed into place:
    next to it, named for this process and thread (two processes placing one file
    never share one)."""
    return dest.with_name(f".{dest.name}.{os.getpid()}.{threading.get_ident()}.tmp")


_TEMP_NAME = re.compile(r"^\..+\.[0-9]+\.[0-9]+\.tmp$")


def is_temp_name(name: str) -> bool:
    """Is ``name`` a ``temp_name``, some process's copy still being made?"""
    return _TEMP_NAME.match(name) is not None


def hash_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def stat_key(st: os.stat_result) -> str:
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"
