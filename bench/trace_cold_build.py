"""How many engine modules a cold build passes through: the modules entered and the
distinct module-to-module call edges of one cold ``qbuild build`` (the example plugin
rules of ``examples/plugin-textstats`` style: a filegroup and a ``command`` target),
traced in-process with ``sys.setprofile``, and the deepest call path in module
boundaries crossed (how far a reader follows calls from the command line down). Works
on any qbuild layout (flat or in sub-packages), so two commits can be compared:

    python bench/trace_cold_build.py            # this checkout's qbuild
"""

from __future__ import annotations

import os
import sys
import tempfile
import textwrap
from collections import Counter
from pathlib import Path


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="qbuild-trace-"))
    (work / "qbuild.toml").write_text(f'[settings]\ncache_dir = "{work / "cache"}"\n')
    (work / "p").mkdir()
    (work / "p" / "a.txt").write_text("alpha\n")
    (work / "p" / "BUILD.toml").write_text(textwrap.dedent("""
        [files]
        rule = "filegroup"
        srcs = ["a.txt"]

        [upper]
        rule = "command"
        srcs = [":files"]
        outs = ["upper.txt"]
        cmd = "tr a-z A-Z < $(SRCS) > $(OUT)"
    """))
    os.chdir(work)
    from qbuild import cli

    edges: Counter[tuple[str, str]] = Counter()
    modules: set[str] = set()

    deepest: list[str] = []

    def profile(frame, event, _arg):  # type: ignore[no-untyped-def]
        if event != "call":
            return
        callee = frame.f_globals.get("__name__", "")
        caller_frame = frame.f_back
        caller = caller_frame.f_globals.get("__name__", "") if caller_frame else ""
        if _engine(callee):
            modules.add(callee)
            if _engine(caller) and caller != callee:
                edges[(caller, callee)] += 1
                path = _module_path(frame)
                if len(path) > len(deepest):
                    deepest[:] = path

    sys.setprofile(profile)
    try:
        code = cli.main(["build", "//p:upper", "--jobs=1"])
    except SystemExit as exc:
        code = exc.code
    finally:
        sys.setprofile(None)
    pairs = {frozenset(e) for e in edges if (e[1], e[0]) in edges}
    upward = [e for e in edges if _rank(e[0]) is not None and _rank(e[1]) is not None
              and _rank(e[1]) > _rank(e[0])]  # type: ignore[operator]
    print(f"exit {code}: {len(modules)} engine modules entered, {len(edges)} module-to-module "
          f"call edges, {len(pairs)} module pairs calling each other both ways, "
          f"{len(upward)} calls up the layering")
    print(f"the deepest call path crosses {len(deepest) - 1} module boundaries "
          f"(what a reader follows from the command line down): {' -> '.join(deepest)}")
    for pair in sorted(sorted(p) for p in pairs):
        print("  both ways:", " <-> ".join(pair))
    for caller, callee in sorted(upward):
        print("  up:", caller, "->", callee)


def _engine(module: str) -> bool:
    return module == "qbuild" or module.startswith("qbuild.")


def _module_path(frame) -> list[str]:  # type: ignore[no-untyped-def]
    """The engine modules on the stack from the outermost call down to ``frame``, each
    entry a change of module (frames of other code in between are skipped)."""
    path: list[str] = []
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if _engine(name) and (not path or path[-1] != name):
            path.append(name)
        frame = frame.f_back
    return path[::-1]


_LAYERS = ("core", "api", "store", "analysis", "keys", "execution", "shortcuts", "build",
           "commands")


def _rank(module: str) -> int | None:
    """The layer of a module of the layered engine (None on a flat one)."""
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in _LAYERS:
        return _LAYERS.index(parts[1])
    return None


if __name__ == "__main__":
    main()
