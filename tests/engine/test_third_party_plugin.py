"""The plugin path end to end: pip-install the example plugin into a fresh virtual
environment and build with its rule through the real CLI."""

import os
import site
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_installed_third_party_plugin_is_found_and_builds(tmp_path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(system_site_packages=True, with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    # The new environment sees this interpreter's packages (qbuild and its dependencies)
    # even when that interpreter is itself a virtual environment, whose packages
    # system_site_packages would not reach.
    purelib = subprocess.run([str(python), "-c",
                              "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    host = [p for p in site.getsitepackages() if Path(p).is_dir()]
    Path(purelib, "qbuild_host.pth").write_text(
        "".join(f"import site; site.addsitedir({p!r})\n" for p in host))
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps",
                    str(ROOT / "examples" / "plugin-wordcount")],
                   check=True, capture_output=True)
    ws = tmp_path / "ws"
    (ws / "docs").mkdir(parents=True)
    (ws / "qbuild.toml").write_text(f'[settings]\ncache_dir = "{tmp_path / "cache"}"\n')
    (ws / "docs" / "a.txt").write_text("to be or not to be")
    (ws / "docs" / "BUILD.toml").write_text(
        '[words]\nrule = "word_count"\nsrcs = ["a.txt"]\nmin_length = 2\n')
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    rules = subprocess.run([str(python), "-m", "qbuild", "rules"], cwd=ws, env=env,
                           capture_output=True, text=True)
    assert "word_count" in rules.stdout and "qbuild-wordcount 1.0.0" in rules.stdout
    build = subprocess.run([str(python), "-m", "qbuild", "build", "//docs:words"], cwd=ws,
                           env=env, capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    assert (ws / "qbuild-out/docs/@words/words.count").read_text() == "6\n"
    # A wheel install: the rule's code is identified by the RECORD hashes, not re-hashed.
    probe = ("from qbuild.keys.code import CodeDigests\n"
             "from qbuild.core.files import SourceDigests\n"
             "class Memo:\n"
             "    def memo_get(self, key): return None\n"
             "    def memo_put(self, key, digest): pass\n"
             "digests = SourceDigests(Memo())\n"
             "_, files = CodeDigests(digests, ['qbuild-wordcount']).unit('qbuild_wordcount')\n"
             "print(digests.bytes_hashed, sorted(files))\n")
    code = subprocess.run([str(python), "-c", probe], cwd=tmp_path, env=env,
                          capture_output=True, text=True)
    assert code.stdout.startswith("0 ['qbuild_wordcount/__init__.py'"), code.stdout + code.stderr
    tests = subprocess.run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            str(ROOT / "examples/plugin-wordcount/tests")], cwd=tmp_path,
                           env=env, capture_output=True, text=True)
    assert tests.returncode == 0, tests.stdout + tests.stderr
    assert sys.executable  # the host interpreter is untouched
