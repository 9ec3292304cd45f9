"""The v2 example plugin end to end: pip-installed into a fresh virtual environment, built
and listed with ``qbuild aquery`` through the real CLI, and its own tests run there."""

import json
import os
import site
import subprocess
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_installed_v2_plugin_builds_and_aquery_lists_its_actions(tmp_path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(system_site_packages=True, with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    purelib = subprocess.run([str(python), "-c",
                              "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    host = [p for p in site.getsitepackages() if Path(p).is_dir()]
    Path(purelib, "qbuild_host.pth").write_text(
        "".join(f"import site; site.addsitedir({p!r})\n" for p in host))
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps",
                    str(ROOT / "examples" / "plugin-textstats")],
                   check=True, capture_output=True)
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
    tests = subprocess.run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            str(ROOT / "examples/plugin-textstats/tests")], cwd=tmp_path,
                           env=env, capture_output=True, text=True)
    assert tests.returncode == 0, tests.stdout + tests.stderr
