"""The v2 example plugin end to end: pip-installed into a fresh virtual environment, built
and listed with ``qbuild aquery`` through the real CLI, and its own tests run there."""

import json
import os
import subprocess
from pathlib import Path

from plugin_env import venv_with_plugin

ROOT = Path(__file__).resolve().parents[2]


def test_installed_v2_plugin_builds_and_aquery_lists_its_actions(tmp_path):
    python = venv_with_plugin(tmp_path / "venv", ROOT / "examples" / "plugin-textstats")
    ws = tmp_path / "ws"
    (ws / "docs").mkdir(parents=True)
    (ws / "qbuild.toml").write_text(f'[settings]\ncache_dir = "{tmp_path / "cache"}"\n')
    (ws / "docs" / "a.txt").write_text("to be or not to be")
    (ws / "docs" / "BUILD.toml").write_text(
        '[stats]\nrule = "text_stats"\nsrcs = ["a.txt"]\nmin_length = 2\n'
        '[files]\nrule = "filegroup"\nsrcs = ["a.txt"]\n'
        '[bad]\nrule = "text_ranking"\ntexts = [":files"]\ntags = ["manual"]\n')
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    def qbuild(*args):
        return subprocess.run([str(python), "-m", "qbuild", *args], cwd=ws, env=env,
                              capture_output=True, text=True)

    before = json.loads(qbuild("aquery", "//docs:stats", "--output=json").stdout)
    assert [r["mnemonic"] for r in before] == ["Count", "Report"]
    assert before[0]["function"] == "qbuild_textstats:count" and before[1]["key"] is None
    build = qbuild("build", "//docs:stats")
    assert build.returncode == 0, build.stderr
    assert (ws / "qbuild-out/docs/@stats/stats.json").read_text() == (
        '{"words": 6, "longest": "not"}\n')
    text = qbuild("aquery", "//docs:stats").stdout
    assert "action 'Count' of //docs:stats (qbuild_textstats:count)" in text
    assert text.count("(cached)") == 2, text
    bad = qbuild("build", "//docs:bad")
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        "ERROR: docs/BUILD.toml, target //docs:bad, attribute 'texts': //docs:files (rule "
        "'filegroup') does not provide TextStatsInfo (it provides: DefaultInfo)"]
    # (without this repository's pytest options: no workers for the plugin's few tests)
    tests = subprocess.run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            "-o", "addopts=", str(ROOT / "examples/plugin-textstats/tests")],
                           cwd=tmp_path, env=env, capture_output=True, text=True)
    assert tests.returncode == 0, tests.stdout + tests.stderr
