"""A differential oracle (issue 24, "by design"): a seeded random small workspace and a
random sequence of steps; after every step the workspace is built through the real CLI
twice (whatever path it takes: incremental, then usually the no-op fast path) and each
answer (exit code, and every byte of every output) must be a clean build's: a copy of
the workspace with an empty local cache, no remote cache and no cluster, built with the
same flags otherwise.

Each step makes one change to the workspace or its environment (an edit, a same-size
edit with the mtime put back, ``LANG``, the machine class, a ``[toolchain]`` pin, a tool
upgraded on PATH, a rule code edit) and one to the services: the remote cache switched
on or off (``FaultServer`` on 127.0.0.1, one URL prefix per sequence); the server
misbehaving for the step (5xx to everything, a 5xx storm, bodies cut short, wrong bytes
under a digest, garbage action entries, reset connections); its contents damaged (an
entry served for another key, truncated or garbage JSON, a metadata blob that is not
JSON, a blob's bytes changed, blobs and entries evicted; what the last steps wrote
first); the local cache lost (another machine: no cache, no ``qbuild-out``; or ``qbuild
cache gc`` to nothing), which also happens in most steps whose server misbehaves or is
damaged and a quarter of the others; builds sent to a Dask cluster (a scheduler and two
worker processes on 127.0.0.1, ``--strategy=*=remote --remote_local_fallback``) or kept
here. Sequences start with both the cache and the cluster on. A clean build runs
whenever what its answer depends on (files, environment, pins, tools, rule code)
changed; other steps reuse the last clean answer.

The rule code edited is a private copy of the built-in ``command`` rule's plugin, first
on ``PYTHONPATH`` of the client and of the workers (the entry point resolves to it);
bytecode is not written, so a same-second edit cannot leave a stale ``.pyc`` in play. A
worker takes its code digests once per process and has its own ``LANG``, so after a
code edit or a ``LANG`` change it refuses (the fallback builds here) until the sequence
restarts the workers, which it does after the first cluster step that met the change,
as an operator would after an install.

Replaying and longer runs (a failure names its seed and every step so far):

- ``QB_DIFF_SEED=N``: the default test runs sequence N (5 unless set; it also checks
  that sequence 5 met remote hits, a server given up, refused entries, actions run on
  the cluster and refused by it).
- ``QB_DIFF_LONG=K``: ``test_long_sequences`` runs K sequences of ``QB_DIFF_STEPS``
  random steps (40 unless set) after the first round, seeds ``QB_DIFF_SEED``, +1, ...
  when it is set, else random ones; skipped otherwise.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import qbuild_generic
from remote_servers import FaultServer, free_port

from qbuild import dist_version

PLUGGY = dist_version("pluggy")
DEFAULT_SEED = 5
EXTRA_STEPS = 1  # after every kind of operation once, in the default test
LONG_STEPS = int(os.environ.get("QB_DIFF_STEPS", "40"))
MODES = ["error", "storm", "truncate", "wrong_bytes", "garbage_ac", "reset"]
# Steps that also lose the local cache (another machine builds the step): most of those
# whose server misbehaves or is damaged (only what is not here is looked up there).
FRESH = {"misbehave": 0.6, "damage": 0.6, "": 0.25}
TIMEOUT = 3  # --remote_timeout: a server answering 5xx to everything costs this, once


class Cluster:
    """A ``dask scheduler`` and two ``dask worker`` processes on 127.0.0.1, started like
    an operator would, with the environment the sequences' clients use (their tools
    and their copy of the rule code first on the paths)."""

    def __init__(self, base: Path, env: dict[str, str]) -> None:
        import distributed

        self.distributed = distributed
        self.base, self.env = base, env
        self.port = free_port()
        self.url = f"dask://127.0.0.1:{self.port}"
        self.scheduler = self._start("scheduler", [
            "scheduler", "--host", "127.0.0.1", "--port", str(self.port),
            "--dashboard-address", ":0"])
        self.workers: list[subprocess.Popen[bytes]] = []
        self.restarts = 0
        self.loaded: str | None = None  # the rule code the workers took their digests of
        self._workers()

    def _start(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        with open(self.base / f"{name}.log", "ab") as log:  # (the process has its own)
            return subprocess.Popen([sys.executable, "-m", "dask", *args], stdout=log,
                                    stderr=subprocess.STDOUT, env=self.env,
                                    start_new_session=True)

    def _workers(self) -> None:
        for i in range(2):
            self.workers.append(self._start(f"worker-{i}", [
                "worker", f"tcp://127.0.0.1:{self.port}", "--nthreads", "1", "--host",
                "127.0.0.1", "--no-dashboard", "--name", f"w{i}"]))
        with self.distributed.Client(f"tcp://127.0.0.1:{self.port}", timeout=60) as client:
            client.wait_for_workers(2, timeout=120)

    def restart_workers(self, lang: str) -> None:
        """New worker processes with ``LANG`` set to ``lang`` (they take the code
        digests again)."""
        _stop(self.workers)
        self.env = {**self.env, "LANG": lang}
        self.workers = []
        self.restarts += 1
        self.loaded = None
        self._workers()

    def stop(self) -> None:
        _stop([*self.workers, self.scheduler])


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except OSError:
                pass
    for proc in procs:
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


class Services:
    """What the sequences of a module share: the folder of tools on PATH, the copy of the
    rule code, the cache server and the cluster (their environment is fixed when they
    start, so these folders are too)."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.tools = base / "tools"
        self.code = base / "code" / "qbuild_generic"
        self.tools.mkdir(parents=True)
        self.code.mkdir(parents=True)
        self.path = f"{self.tools}{os.pathsep}{os.environ['PATH']}"
        self.pythonpath = os.pathsep.join(
            [str(self.code.parent), *[p for p in [os.environ.get("PYTHONPATH")] if p]])
        self.server = FaultServer()
        self.cluster: Cluster | None = None
        self.sequences = 0

    def start_cluster(self) -> Cluster:
        if self.cluster is None:
            env = {k: v for k, v in os.environ.items() if not k.startswith("QBUILD_")}
            env.update({"PATH": self.path, "PYTHONPATH": self.pythonpath, "LANG": "C",
                        "PYTHONDONTWRITEBYTECODE": "1",
                        "QBUILD_WORKER_CACHE_DIR": str(self.base / "worker-cache")})
            self.cluster = Cluster(self.base, env)
        return self.cluster

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()
        self.server.stop()


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    pytest.importorskip("distributed")
    shared = Services(tmp_path_factory.mktemp("diff-shared"))
    yield shared
    shared.stop()


class World:
    """The workspace, its environment, the cache server and the cluster, and the
    operations on them."""

    def __init__(self, base: Path, rng: random.Random, services: Services) -> None:
        self.base, self.rng, self.services = base, rng, services
        self.root = base / "ws"
        self.tools = services.tools
        self.code = services.code
        self.env = {"LANG": "C", "QBUILD_MACHINE_CLASS": "box-a"}
        self.pin = ""
        self.flag: list[str] = []
        self.clean_builds = 0
        self.remote = True  # builds use the cache server
        self.dask = True  # builds send their actions to the cluster
        services.start_cluster()
        self.server = services.server
        services.sequences += 1
        self.prefix = f"/seq{services.sequences}"  # this sequence's part of the server
        self.server.mode, self.server.errors_left = "ok", 0
        self._tool("1")
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
        self._clean_answers: dict[str, tuple[int, dict[str, bytes]]] = {}
        self.used_cluster = False  # in the current step
        self.marks = [0, len(self.server.requests)]  # the server's requests at each step
        self.seen = dict.fromkeys(["remote hits", "server given up", "refused entries",
                                   "run on the cluster", "refused by workers"], 0)

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

    # -- the operations on the workspace and its environment --------------------------------
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

    # -- the operations on the cache server and the cluster ---------------------------------
    def switch_cache(self) -> str:
        self.remote = not self.remote
        self.dask = self.dask and self.remote  # (the cluster's data plane is the cache)
        return f"remote cache {'on' if self.remote else 'off (and the cluster)'}"

    def misbehave(self) -> str:
        self.remote = True
        mode = self.rng.choice(MODES)
        self.server.mode = mode
        if mode == "storm":
            self.server.errors_left = self.rng.randint(1, 3)
            return f"server: 503 to the next {self.server.errors_left} requests"
        return f"server mode {mode}"

    def damage(self) -> str:
        self.remote = True
        server, rng = self.server, self.rng
        with server.lock:
            # What the last two steps wrote, if anything is left of it: the entries the
            # next builds look up (sorted: upload threads finish in any order).
            recent = {p for m, p, _ in server.requests[self.marks[-2]:]
                      if m == "PUT" and p in server.blobs and p.startswith(self.prefix + "/")}
            mine = sorted(recent or (p for p in server.blobs
                                     if p.startswith(self.prefix + "/")))
            entries = [p for p in mine if "/ac/" in p]
            blobs = [p for p in mine if "/cas/" in p]
            metas = [p for p in blobs if _is_meta(server.blobs[p])]
            kinds = [k for k, ok in [("another key's entry", len(entries) > 1),
                                     ("truncated entry", entries),
                                     ("garbage entry", entries),
                                     ("garbage metadata", metas),
                                     ("wrong bytes", blobs),
                                     ("evicted blobs", blobs),
                                     ("evicted entries", entries)] if ok]
            if not kinds:
                return "server: nothing to damage yet"
            # Entries the gate must refuse first: they are met on every lookup, damaged
            # blobs only when downloaded.
            kind = rng.choices(kinds, [1 if k in ("wrong bytes", "evicted blobs",
                                                  "evicted entries") else 3
                                       for k in kinds])[0]
            if kind == "another key's entry":
                a, b = rng.sample(entries, 2)
                server.blobs[a] = server.blobs[b]
                return f"server: {_short(a)} answers {_short(b)}'s entry"
            if kind in ("truncated entry", "garbage entry"):
                path = rng.choice(entries)
                body = server.blobs[path]
                server.blobs[path] = (body[: rng.randint(0, len(body) - 1)]
                                      if kind == "truncated entry"
                                      else rng.choice([b"[]", b"{\"outputFiles\": 7}",
                                                       b"[" * 5000, b"\xff\xfe"]))
                return f"server: {kind} {_short(path)}"
            if kind == "garbage metadata":
                path = rng.choice(metas)
                server.blobs[path] = b"{" * len(server.blobs[path])
                return f"server: metadata {_short(path)} not JSON"
            if kind == "wrong bytes":
                path = rng.choice(blobs)
                body = server.blobs[path]
                server.blobs[path] = bytes(reversed(body)) if len(set(body)) > 1 else \
                    bytes((b + 1) % 256 for b in body) or b"x"
                return f"server: blob {_short(path)} holds other bytes"
            victims = rng.sample(blobs if kind == "evicted blobs" else entries,
                                 rng.randint(1, len(blobs if kind == "evicted blobs"
                                                    else entries)))
            for path in victims:
                del server.blobs[path]
            return f"server: {len(victims)} {kind}"

    def lose_local_cache(self) -> str:
        """Another machine (no local cache, no qbuild-out), or the local cache collected
        down to nothing: what is not here must come from the remote cache or run."""
        if self.rng.random() < 0.5:
            shutil.rmtree(self.base / "cache", ignore_errors=True)
            shutil.rmtree(self.root / "qbuild-out", ignore_errors=True)
            return "a fresh machine: no local cache, no qbuild-out"
        proc = subprocess.run([sys.executable, "-m", "qbuild", "cache", "gc", "--max-size",
                               "1K"], cwd=self.root, env=self._environ(),
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return "qbuild cache gc --max-size 1K"

    def switch_cluster(self) -> str:
        self.dask = not self.dask
        if self.dask:
            self.remote = True
            self.services.start_cluster()
        return f"cluster {'on (and the remote cache)' if self.dask else 'off'}"

    def changes(self) -> list[Callable[[], str]]:
        """What the workspace and its environment can do."""
        return [self.edit, self.same_size_edit, self.language, self.machine_class,
                self.toolchain, self.upgrade_tool, self.edit_rule_code]

    def services_ops(self) -> list[Callable[[], str]]:
        """What the caches, the server and the cluster can do."""
        return [self.switch_cache, self.misbehave, self.damage, self.lose_local_cache,
                self.switch_cluster]

    # -- building -----------------------------------------------------------------------
    def _environ(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("QBUILD_")}
        env.update(self.env)
        env["PATH"] = self.services.path
        env["PYTHONPATH"] = self.services.pythonpath
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        return env

    def _flags(self) -> list[str]:
        flags = list(self.flag)
        if self.remote:
            flags += [f"--remote_cache={self.server.url}{self.prefix}",
                      f"--remote_timeout={TIMEOUT}"]
        if self.dask:
            cluster = self.services.start_cluster()
            if cluster.loaded is None:
                cluster.loaded = self.plugin.read_text()
            self.used_cluster = True
            flags += [f"--remote_executor={cluster.url}", "--strategy=*=remote",
                      "--remote_local_fallback"]
        return flags

    def build(self, root: Path, flags: list[str] | None = None
              ) -> tuple[int, dict[str, bytes]]:
        args = self._flags() if flags is None else flags
        proc = subprocess.run([sys.executable, "-m", "qbuild", "build", "//p/...", *args],
                              cwd=root, env=self._environ(), capture_output=True, text=True,
                              timeout=300)
        assert "Traceback" not in proc.stderr, proc.stderr
        if flags is None:
            self._count(proc.stderr)
        outputs = {}
        if proc.returncode == 0:
            out = root / "qbuild-out" / "p"
            for path in sorted(out.rglob("*")):
                if path.is_file():
                    outputs[path.relative_to(out).as_posix()] = path.read_bytes()
        self.last_log = proc.stderr
        return proc.returncode, outputs

    def _count(self, log: str) -> None:
        """What the build did with the remote cache and the cluster (``seen``; from its
        messages: ``--event_log`` would keep it off the no-op fast path)."""
        seen = self.seen
        for pattern, name in ((r"\((\d+) from the remote cache\)", "remote hits"),
                              (r", (\d+) run on \d+ Dask workers", "run on the cluster")):
            seen[name] += sum(int(n) for n in re.findall(pattern, log))
        for line in log.splitlines():
            if line.startswith("WARNING: remote cache"):
                seen["refused entries" if " is a miss " in line else "server given up"] += 1
            elif line.startswith("WARNING: worker ") and " refused " in line:
                seen["refused by workers"] += 1

    def _fingerprint(self) -> str:
        """Everything a clean build's answer can depend on."""
        digest = hashlib.sha256()
        for path in sorted(self.root.rglob("*")):
            rel = path.relative_to(self.root).as_posix()
            if path.is_file() and not rel.startswith("qbuild-out"):
                digest.update(rel.encode() + b"\0" + path.read_bytes() + b"\0")
        for extra in (json.dumps([self.env, self.pin, self.flag]),
                      (self.tools / "mytool").read_text(), self.plugin.read_text()):
            digest.update(extra.encode() + b"\0")
        return digest.hexdigest()

    def clean(self) -> tuple[int, dict[str, bytes]]:
        fingerprint = self._fingerprint()
        known = self._clean_answers.get(fingerprint)
        if known is not None:
            return known
        self.clean_builds += 1
        copy = self.base / f"clean-{self.clean_builds}"
        shutil.copytree(self.root, copy, ignore=shutil.ignore_patterns("qbuild-out"))
        self._settings(copy, f"../clean-cache-{self.clean_builds}")
        try:
            answer = self.build(copy, flags=list(self.flag))
        finally:
            shutil.rmtree(copy)
            shutil.rmtree(self.base / f"clean-cache-{self.clean_builds}", ignore_errors=True)
        self._clean_answers[fingerprint] = answer
        return answer

    def end_step(self) -> None:
        """Restart the workers once a cluster step has met rule code they did not load
        or another ``LANG`` than theirs (they refused its actions); take back a pin this
        installation does not meet unless mismatches only warn (every later step would
        check exit code 2 only) and the server's misbehaviour."""
        with self.server.lock:
            self.marks.append(len(self.server.requests))
        if self.pin == "0.0.1" and not self.flag:
            self.pin = ""
            self._settings(self.root, "../cache")
        cluster = self.services.cluster
        if self.used_cluster and cluster is not None and (
                cluster.env["LANG"] != self.env["LANG"] or
                cluster.loaded not in (None, self.plugin.read_text())):
            cluster.restart_workers(self.env["LANG"])
        self.server.mode = "ok"  # (a server misbehaves for one step)
        self.used_cluster = False


def _is_meta(body: bytes) -> bool:
    try:
        return isinstance(json.loads(body), dict) and "components" in json.loads(body)
    except ValueError:
        return False


def _short(path: str) -> str:
    kind, _, digest = path.rpartition("/")
    return f"{kind.rsplit('/', 1)[-1]}/{digest[:8]}"


def run_sequence(base: Path, seed: int, services: Services, steps: int | None) -> World:
    """Sequence ``seed``: each step one change and one service operation; every kind of
    both once in a seeded order, then ``steps`` random steps (EXTRA_STEPS when None).
    Asserts each step's answers."""
    print(f"sequence seed {seed}", flush=True)
    rng = random.Random(seed)
    world = World(base, rng, services)
    how = (f"QB_DIFF_SEED={seed}" if steps is None else
           f"QB_DIFF_SEED={seed} QB_DIFF_LONG=1 QB_DIFF_STEPS={steps}")
    replay = f"seed {seed} (replay: {how} pytest {__file__})"
    history = ["initial build"]
    first = world.build(world.root)
    assert first[0] == 0 and first == world.clean(), f"{replay}: {history}\n{world.last_log}"
    changes, services_ops = world.changes(), world.services_ops()
    plan = list(zip(rng.sample(changes, len(changes)),
                    (rng.sample(services_ops, len(services_ops)) * 2)[:len(changes)]))
    plan += [(rng.choice(changes), rng.choice(services_ops))
             for _ in range(EXTRA_STEPS if steps is None else steps)]
    for change, service in plan:
        done = [service(), change()]
        if service != world.lose_local_cache and \
                rng.random() < FRESH.get(service.__name__, FRESH[""]):
            done.append(world.lose_local_cache())
        history.append(", ".join(done))
        expected = world.clean()
        for attempt in ("after the step", "again (the fast path's turn)"):
            got = world.build(world.root)
            assert got == expected, (f"{replay}, {attempt}: {history}\n"
                                     f"{_differences(got, expected)}\n{world.last_log}")
        world.end_step()
    return world


def _differences(got: tuple[int, dict[str, bytes]], expected: tuple[int, dict[str, bytes]]
                 ) -> str:
    if got[0] != expected[0]:
        return f"exit code {got[0]}, a clean build's {expected[0]}"
    names = sorted(set(got[1]) | set(expected[1]))
    return "; ".join(f"{n}: {got[1].get(n)!r} vs clean {expected[1].get(n)!r}"
                     for n in names if got[1].get(n) != expected[1].get(n))


def test_every_path_gives_a_clean_build_s_bytes(tmp_path, services):
    seed = int(os.environ.get("QB_DIFF_SEED", str(DEFAULT_SEED)))
    world = run_sequence(tmp_path, seed, services, None)
    if seed == DEFAULT_SEED:  # the default sequence does what it is for
        assert all(world.seen.values()), world.seen


@pytest.mark.skipif(not os.environ.get("QB_DIFF_LONG"), reason="QB_DIFF_LONG=K runs K "
                    "long sequences (see the module's docstring)")
def test_long_sequences(tmp_path, services):
    count = int(os.environ["QB_DIFF_LONG"])
    given = os.environ.get("QB_DIFF_SEED")
    first = int(given) if given else random.SystemRandom().randrange(1 << 30)
    for seed in range(first, first + count):
        run_sequence(tmp_path / f"seq-{seed}", seed, services, LONG_STEPS)
