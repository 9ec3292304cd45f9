"""A differential oracle (issue 24, "by design"): a seeded random small workspace and a
random sequence of operations (edits, same-size edits with the mtime put back, ``LANG``
and machine-class changes, ``[toolchain]`` pins, a tool upgraded on PATH, rule code
edits); after every step the workspace is built through the real CLI twice (whatever
path it takes: incremental, then usually the no-op fast path) and each answer (exit
code, and every byte of every output) must be a clean build's: a copy of the workspace
with an empty cache, built the same way.

The rule code edited is a private copy of the built-in ``command`` rule's plugin, first
on ``PYTHONPATH`` (the entry point resolves to it); bytecode is not written, so a
same-second edit cannot leave a stale ``.pyc`` in play. ``QB_DIFF_SEED`` picks another
sequence."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import qbuild_generic

from qbuild import dist_version

STEPS = 8
PLUGGY = dist_version("pluggy")


class World:
    """The workspace, its environment and the operations on them."""

    def __init__(self, base: Path, rng: random.Random) -> None:
        self.base, self.rng = base, rng
        self.root = base / "ws"
        self.tools = base / "tools"
        self.code = base / "code" / "qbuild_generic"
        self.env = {"LANG": "C", "QBUILD_MACHINE_CLASS": "box-a"}
        self.pin = ""
        self.flag: list[str] = []
        self.clean_builds = 0
        self.tools.mkdir(parents=True)
        self._tool("1")
        self.code.mkdir(parents=True)
        source = Path(qbuild_generic.__file__).read_text()
        anchor = 'env.update({"HOME": str(home), "TMPDIR": str(home)})\n'
        assert anchor in source
        self.plugin = self.code / "__init__.py"
        self.plugin.write_text(source.replace(anchor, anchor + '    env["QB_CODE"] = "v0"\n'))
        self.sources = [f"s{i}.txt" for i in range(rng.randint(2, 4))]
        for name in self.sources:
            self._write(name, self._text())
        self._write("BUILD.toml", self._build_file())
        self._settings(self.root, "../cache")

    # -- the workspace ------------------------------------------------------------------
    def _text(self) -> str:
        return "".join(self.rng.choice("abcdef\n") for _ in range(self.rng.randint(1, 12)))

    def _write(self, name: str, text: str) -> None:
        path = self.root / "p" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    def _build_file(self) -> str:
        rng = self.rng
        picked = rng.sample(self.sources, rng.randint(1, len(self.sources)))
        blocks = [
            ("cat", {"srcs": picked, "cmd": "cat $(SRCS) > $(OUT)"}),
            ("tool", {"srcs": [rng.choice(self.sources)],
                      "cmd": 'echo "$(mytool)" | cat - $(SRCS) > $(OUT)'}),
            ("lang", {"cmd": "echo lang=$LANG > $(OUT)"}),
            ("code", {"cmd": "echo code=$QB_CODE > $(OUT)"}),
            ("chain", {"srcs": [":cat", rng.choice(self.sources)],
                       "cmd": "sort $(SRCS) | uniq -c > $(OUT)"}),
        ]
        out = []
        for name, attrs in blocks:
            srcs = ", ".join(f'"{s}"' for s in attrs.get("srcs", []))
            out.append(f'[{name}]\nrule = "command"\nsrcs = [{srcs}]\nouts = ["{name}.out"]\n'
                       f"cmd = '''{attrs['cmd']}'''\n")
        return "\n".join(out)

    def _settings(self, root: Path, cache: str) -> None:
        toolchain = f"[toolchain]\npluggy = '{self.pin}'\n" if self.pin else ""
        (root / "qbuild.toml").write_text(f"[settings]\ncache_dir = '{cache}'\n{toolchain}")

    def _tool(self, version: str) -> None:
        tool = self.tools / "mytool"
        tool.write_text(f"#!/bin/sh\necho tool-{version}\n")
        tool.chmod(0o755)

    # -- the operations -----------------------------------------------------------------
    def edit(self) -> str:
        name = self.rng.choice(self.sources)
        self._write(name, self._text() + "edited\n")
        return f"edit {name}"

    def same_size_edit(self) -> str:
        name = self.rng.choice(self.sources)
        path = self.root / "p" / name
        old = path.read_bytes()
        st = path.stat()
        new = bytes((b + 1 - 97) % 6 + 97 if 97 <= b <= 102 else b for b in old)
        path.write_bytes(new if new != old else old.upper())
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        return f"same-size edit of {name}, mtime put back"

    def language(self) -> str:
        self.env["LANG"] = self.rng.choice(["C", "C.UTF-8", "POSIX"])
        return f"LANG={self.env['LANG']}"

    def machine_class(self) -> str:
        self.env["QBUILD_MACHINE_CLASS"] = self.rng.choice(["box-a", "box-b", "box-c"])
        return f"QBUILD_MACHINE_CLASS={self.env['QBUILD_MACHINE_CLASS']}"

    def toolchain(self) -> str:
        self.pin = self.rng.choice(["", PLUGGY, "0.0.1"])
        self.flag = self.rng.choice([[], ["--toolchain_mismatch=warn"]])
        self._settings(self.root, "../cache")
        return f"pin pluggy={self.pin!r} {self.flag}"

    def upgrade_tool(self) -> str:
        version = str(self.rng.randint(2, 99))
        self._tool(version)
        return f"mytool upgraded to {version}"

    def edit_rule_code(self) -> str:
        text = self.plugin.read_text()
        start = text.index('env["QB_CODE"] = "') + len('env["QB_CODE"] = "')
        end = text.index('"', start)
        version = f"v{self.rng.randint(1, 9)}"
        self.plugin.write_text(text[:start] + version + text[end:])
        return f"command rule code edited ({version})"

    # -- building -----------------------------------------------------------------------
    def _environ(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("QBUILD_")}
        env.update(self.env)
        env["PATH"] = f"{self.tools}{os.pathsep}{os.environ['PATH']}"
        env["PYTHONPATH"] = os.pathsep.join(
            [str(self.code.parent), *[p for p in [os.environ.get("PYTHONPATH")] if p]])
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        return env

    def build(self, root: Path) -> tuple[int, dict[str, bytes]]:
        proc = subprocess.run([sys.executable, "-m", "qbuild", "build", "//p/...", *self.flag],
                              cwd=root, env=self._environ(), capture_output=True, text=True,
                              timeout=300)
        assert "Traceback" not in proc.stderr, proc.stderr
        outputs = {}
        if proc.returncode == 0:
            out = root / "qbuild-out" / "p"
            for path in sorted(out.rglob("*")):
                if path.is_file():
                    outputs[path.relative_to(out).as_posix()] = path.read_bytes()
        return proc.returncode, outputs

    def clean(self) -> tuple[int, dict[str, bytes]]:
        self.clean_builds += 1
        copy = self.base / f"clean-{self.clean_builds}"
        shutil.copytree(self.root, copy, ignore=shutil.ignore_patterns("qbuild-out"))
        self._settings(copy, f"../clean-cache-{self.clean_builds}")
        try:
            return self.build(copy)
        finally:
            shutil.rmtree(copy)
            shutil.rmtree(self.base / f"clean-cache-{self.clean_builds}", ignore_errors=True)


def test_every_path_gives_a_clean_build_s_bytes(tmp_path):
    rng = random.Random(int(os.environ.get("QB_DIFF_SEED", "24")))
    world = World(tmp_path, rng)
    operations = [world.edit, world.same_size_edit, world.language, world.machine_class,
                  world.toolchain, world.upgrade_tool, world.edit_rule_code]
    history = ["initial build"]
    first = world.build(world.root)
    assert first[0] == 0 and first == world.clean(), history
    # Every kind once (the seed orders them), then random ones.
    steps = rng.sample(operations, len(operations))
    steps += [rng.choice(operations) for _ in range(max(0, STEPS - len(steps)))]
    for operation in steps:
        history.append(operation())
        expected = world.clean()
        for attempt in ("after the step", "again (the fast path's turn)"):
            got = world.build(world.root)
            assert got == expected, f"{attempt}: {history}"
