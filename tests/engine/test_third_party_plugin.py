"""The plugin path end to end: pip-install the example plugin into a fresh virtual
environment and build with its rule through the real CLI."""

import os
import subprocess
import sys
from pathlib import Path

from plugin_env import venv_with_plugin

ROOT = Path(__file__).resolve().parents[2]


def test_installed_third_party_plugin_is_found_and_builds(tmp_path):
    python = venv_with_plugin(tmp_path / "venv", ROOT / "examples" / "plugin-wordcount")
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
             "from qbuild.store.digests import SourceDigests\n"
             "class Memo:\n"
             "    def memo_get(self, key): return None\n"
             "    def memo_put(self, key, digest): pass\n"
             "digests = SourceDigests(Memo())\n"
             "_, files = CodeDigests(digests, ['qbuild-wordcount']).unit('qbuild_wordcount')\n"
             "print(digests.bytes_hashed, sorted(files))\n")
    code = subprocess.run([str(python), "-c", probe], cwd=tmp_path, env=env,
                          capture_output=True, text=True)
    assert code.stdout.startswith("0 ['qbuild_wordcount/__init__.py'"), code.stdout + code.stderr
    # (without this repository's pytest options: no workers for the plugin's few tests)
    tests = subprocess.run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            "-o", "addopts=", str(ROOT / "examples/plugin-wordcount/tests")],
                           cwd=tmp_path, env=env, capture_output=True, text=True)
    assert tests.returncode == 0, tests.stdout + tests.stderr
    assert sys.executable  # the host interpreter is untouched
