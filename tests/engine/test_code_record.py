"""Installed rule code is keyed by its ``RECORD`` hashes only while the file is as it was
installed (issue 24, defect 7): a same-size edit of an installed plugin, even with its
mtime put back, changes the code digest; an untouched install is still read from
``RECORD`` without hashing a byte."""

from __future__ import annotations

import base64
import hashlib
import os

try:
    from qbuild.keys import code as _code
    from qbuild.store.digests import SourceDigests
except ImportError:  # the flat layout of 05cd88b
    from qbuild._digest import SourceDigests  # type: ignore[no-redef]

    from qbuild import _code  # type: ignore[no-redef]


class _Memo:
    def memo_get(self, key):
        return None

    def memo_put(self, key, digest):
        pass


def _install(site, text: bytes) -> None:
    """A wheel install of ``recplug`` as pip leaves it: files first, RECORD last."""
    package = site / "recplug"
    package.mkdir(parents=True)
    (package / "__init__.py").write_bytes(text)
    info = site / "recplug-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: recplug\nVersion: 1.0\n")
    digest = base64.urlsafe_b64encode(hashlib.sha256(text).digest()).rstrip(b"=").decode()
    record = info / "RECORD"
    rows = f"recplug/__init__.py,sha256={digest},{len(text)}\nrecplug-1.0.dist-info/RECORD,,\n"
    record.write_text(rows)
    # RECORD is written after the files it lists; on a coarse clock the two may share a
    # tick, so write it until its change time is later (the state pip leaves).
    while os.stat(record).st_ctime_ns <= os.stat(package / "__init__.py").st_ctime_ns:
        record.write_text(rows)


def _unit(dist: str = "recplug") -> tuple[str, int]:
    _code._records.clear()
    digests = SourceDigests(_Memo())
    digest, _files = _code.CodeDigests(digests, [dist]).unit("recplug")
    return digest, digests.bytes_hashed


def test_a_same_size_edit_of_an_installed_plugin_changes_its_code_digest(tmp_path,
                                                                         monkeypatch):
    site = tmp_path / "site"
    _install(site, b"VALUE = 1\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(_code, "_records", {})
    untouched, hashed = _unit()
    assert hashed == 0  # as installed: RECORD vouches for it
    module = site / "recplug" / "__init__.py"
    st = os.stat(module)
    module.write_bytes(b"VALUE = 2\n")  # same size, mtime put back
    os.utime(module, ns=(st.st_atime_ns, st.st_mtime_ns))
    edited, hashed = _unit()
    assert edited != untouched and hashed > 0
