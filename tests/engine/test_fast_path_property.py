"""Property: whatever sequence of edits happens, the no-op fast path and the incremental
path (``_incremental``: the last build's keys reused for targets whose inputs did not
change) give exactly the answer the full path gives (same exit code, same printed
outputs, same bytes).

A seeded random walk over edits (edit, same-size edit with the mtime put back, add,
delete, rename, new directories, BUILD edits, nested workspaces appearing and going),
each followed by a normal build (fast path if it says nothing changed) and, when the fast
path answered, a full build (``--explain``) to compare with; when it did not, the full
path's answer (which may reuse the cached analysis and the last build's keys) is
compared with a build after deleting the analysis cache and the incremental record:
always when the incremental path reused a key, else half of the time. Runs in-process
through the real command line entry point.
QBUILD_PROPERTY_STEPS raises the number of steps.
"""

import contextlib
import io
import os
import random
import shutil
import time

from qbuild import cli

BUILD = """
[cat]
rule = "command"
srcs = ["*.txt", "d/*/x.txt"]
outs = ["all.txt"]
cmd = "cat $(SRCS) > $(OUT)"

[deep]
rule = "command"
srcs = ["**/*.md"]
outs = ["md.txt"]
cmd = "cat $(SRCS) > $(OUT){extra}"

[size]
rule = "command"
srcs = [":cat", ":deep"]
outs = ["n.txt"]
cmd = "wc -c < $(SRCS) > $(OUT)"
"""

SUB_BUILD = """
[s]
rule = "command"
srcs = ["*.txt"]
outs = ["s.txt"]
cmd = "cat $(SRCS) > $(OUT)"
"""


def _run(args):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(args)
    return code, out.getvalue(), err.getvalue()


def _answer(root, code, stdout):
    lines = stdout.split()
    files = {}
    for line in lines:
        path = root / line
        files[line] = path.read_bytes() if path.is_file() else None
    return code, lines, files


class Walker:
    """Random edits of a small workspace."""

    def __init__(self, root, rng):
        self.root = root
        self.rng = rng
        self.counter = 0

    def files(self, suffixes=(".txt", ".md")):
        out = []
        for directory, dirs, names in os.walk(self.root):
            dirs[:] = [d for d in dirs if d != "qbuild-out"]
            out += [os.path.join(directory, n) for n in names if n.endswith(suffixes)]
        return sorted(out)

    def text(self, size=None):
        size = size if size is not None else self.rng.randint(1, 12)
        return "".join(self.rng.choice("abcdefgh") for _ in range(size))

    def new_path(self):
        self.counter += 1
        n = self.counter
        return self.rng.choice([f"p/n{n}.txt", f"p/d/k{n}/x.txt", f"p/d/a/x{n}.txt",
                                f"p/m{n}.md", f"p/e{n}/f/g.md", f"p/sub/t{n}.txt",
                                f"p/d/a/y{n}.md", f"p/z{n}.log"])

    def step(self):
        rng = self.rng
        op = rng.choice(["edit", "same_size", "same_size", "add", "delete", "rename",
                         "mkdir", "build_edit", "nested", "touch"])
        files = self.files()
        # The first file of each glob stays, so most builds succeed.
        anchors = {str(self.root / rel) for rel in ("p/a.txt", "p/d/a/x.txt", "p/c.md")}
        movable = [f for f in files if f not in anchors]
        if op in ("delete", "rename") and not movable:
            op = "add"
        if op == "edit":
            with open(rng.choice(files), "w") as handle:
                handle.write(self.text())
        elif op == "same_size":
            path = rng.choice(files)
            st = os.stat(path)
            with open(path, "r+") as handle:
                old = handle.read()
                handle.seek(0)
                new = self.text(len(old))
                handle.write(new if new != old else old[::-1] + "")
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        elif op == "touch":
            path = rng.choice(files)
            st = os.stat(path)
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
        elif op == "add":
            path = self.root / self.new_path()
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(self.text())
        elif op == "delete":
            os.unlink(rng.choice(movable))
        elif op == "rename":
            source = rng.choice(movable)
            target = self.root / self.new_path()
            target.parent.mkdir(parents=True, exist_ok=True)
            os.rename(source, target)
        elif op == "mkdir":
            self.counter += 1
            (self.root / rng.choice(["p/d", "p", "p/sub"]) / f"dir{self.counter}").mkdir(
                parents=True, exist_ok=True)
        elif op == "build_edit":
            extra = rng.choice(["", "; echo x >> $(OUT)", "; echo y >> $(OUT)"])
            (self.root / "p/BUILD.toml").write_text(BUILD.format(extra=extra))
            if rng.random() < 0.5:
                sub = self.root / "p/sub/BUILD.toml"
                if sub.exists():
                    sub.unlink()
                else:
                    sub.write_text(SUB_BUILD)
        elif op == "nested":
            marker = self.root / "p/sub/qbuild.toml"
            if marker.exists():
                marker.unlink()
            else:
                marker.write_text("")
        return op


def test_fast_path_always_agrees_with_the_full_path(qbuild_workspace, monkeypatch, reused):
    ws = qbuild_workspace
    ws.write("p/BUILD.toml", BUILD.format(extra=""))
    ws.write("p/a.txt", "a")
    ws.write("p/d/a/x.txt", "x")
    ws.write("p/c.md", "c")
    ws.write("p/sub/BUILD.toml", SUB_BUILD)
    ws.write("p/sub/s.txt", "s")
    monkeypatch.chdir(ws.root)
    steps = int(os.environ.get("QBUILD_PROPERTY_STEPS", "120"))
    rng = random.Random(20261123)
    walker = Walker(ws.root, rng)
    fast_answers = fresh_checks = incremental_checks = 0
    checker = random.Random(7)
    history = []
    for step in range(steps):
        ops = [walker.step() for _ in range(rng.choice([0, 0, 1, 1, 2, 3]))]
        history.append(ops)
        if rng.random() < 0.4:
            time.sleep(0.06)  # let the edits age past the racy window so snapshots record
        reused.clear()
        code, stdout, stderr = _run(["build", "//..."])
        if "(nothing changed)" not in stderr:
            # The full path may have reused the cached analysis and the incremental path
            # the last build's keys: a fresh full build must agree.
            incremental = bool(reused)
            if incremental or checker.random() < 0.5:
                cached = _answer(ws.root, code, stdout)
                for name in ("analysis", "incremental"):
                    shutil.rmtree(ws.root / "qbuild-out/.qbuild" / name, ignore_errors=True)
                code, stdout, stderr = _run(["build", "--explain", "//..."])
                assert cached == _answer(ws.root, code, stdout), (
                    f"step {step}: with the cached analysis {cached}, with a fresh one "
                    f"{_answer(ws.root, code, stdout)}; edits since the start: {history}")
                fresh_checks += 1
                incremental_checks += incremental
            continue
        fast_answers += 1
        fast = _answer(ws.root, code, stdout)
        code, stdout, stderr = _run(["build", "--explain", "//..."])
        full = _answer(ws.root, code, stdout)
        assert fast == full, (f"step {step}: the fast path answered {fast}, the full path "
                              f"{full}; edits since the start: {history}")
    print(f"{fast_answers} fast answers, {fresh_checks} fresh analyses "
          f"({incremental_checks} after incremental builds) in {steps} steps")
    assert fast_answers >= steps // 8  # the property was really exercised
    assert incremental_checks >= steps // 20
