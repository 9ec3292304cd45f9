"""A fresh virtual environment with one example plugin pip-installed into it, for the
tests of the plugin path (the plugin's distribution, entry points and wheel RECORD as a
user's ``pip install`` leaves them)."""

from __future__ import annotations

import site
import subprocess
import sys
import venv
from pathlib import Path


def _host_pip_can_target() -> bool:
    """Can this interpreter's pip install into another environment (``pip --python``,
    pip 22.3 and later)? Then the new environment needs no pip of its own, whose
    installation (ensurepip) costs more than the plugin's."""
    try:
        import pip
    except ImportError:
        return False
    major, minor = (int(part) for part in pip.__version__.split(".")[:2])
    return (major, minor) >= (22, 3)


def venv_with_plugin(env_dir: Path, project: Path) -> Path:
    """Make a virtual environment in ``env_dir`` that sees this interpreter's packages
    (qbuild and its dependencies, even when this interpreter is itself a virtual
    environment, whose packages ``system_site_packages`` would not reach), pip-install
    ``project`` into it, and return its ``python``."""
    host_pip = _host_pip_can_target()
    venv.EnvBuilder(system_site_packages=True, with_pip=not host_pip).create(env_dir)
    python = env_dir / "bin" / "python"
    purelib = subprocess.run([str(python), "-c",
                              "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    host = [p for p in site.getsitepackages() if Path(p).is_dir()]
    Path(purelib, "qbuild_host.pth").write_text(
        "".join(f"import site; site.addsitedir({p!r})\n" for p in host))
    pip = [sys.executable, "-m", "pip", "--python", str(python)] if host_pip else \
        [str(python), "-m", "pip"]
    subprocess.run([*pip, "install", "-q", "--no-deps", str(project)], check=True,
                   capture_output=True)
    return python
