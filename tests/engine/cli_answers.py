"""Helpers for the tests that compare a shortcut's answer with the full path's: build
through ``qbuild.cli`` in this process, read the printed outputs, and ask the full path
(no analysis cache, no incremental record, no no-op snapshot) for its answer."""

from __future__ import annotations

import contextlib
import io
import shutil
from pathlib import Path

from qbuild import cli


def build(*args: str) -> tuple[str, str]:
    """``qbuild build *args`` in the current folder: (stdout, stderr); it must succeed."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(["build", *args])
    assert code == 0, err.getvalue()
    return out.getvalue(), err.getvalue()


def outputs(root: Path, stdout: str) -> dict[str, bytes]:
    """The bytes of every output path a build printed."""
    return {line: (root / line).read_bytes() for line in stdout.split()}


def full_answer(root: Path) -> dict[str, bytes]:
    """The full path's answer (no analysis cache, no incremental record, no snapshot)."""
    for name in ("analysis", "incremental", "noop"):
        shutil.rmtree(root / "qbuild-out/.qbuild" / name, ignore_errors=True)
    return outputs(root, build("--explain", "//...")[0])
