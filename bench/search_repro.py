"""Does an ``auto_quantize`` search choose the same model every time? N cold builds of
each example search, each in a fresh ``git clone`` of this repository with its own empty
cache, through the real ``qbuild`` CLI; a markdown table of what each build chose.

Run from the repository root (it clones the committed HEAD, not uncommitted changes):

    nice -n 10 python bench/search_repro.py [--builds 3] [--jobs 2] [SEARCH ...]

SEARCH is a label built at the clone's root (``//examples/yolo:yolo_auto``, the default)
or ``PAGE::LABEL`` for a search a docs page builds step by step
(``docs/walkthrough.md:://classifier:mobilenet_auto``): the page's
``<!-- docs-test: setup -->`` block is run with ``QBUILD_REPO`` set to the clone, and
the page's workspace blocks for the label's BUILD.toml, up to the one that defines the
search, are written as a user would. ``--all`` runs both.

Each build: ``git clone`` into a new folder, ``QBUILD_CACHE_DIR`` an empty folder of its
own, no remote cache, ``PYTHONPATH`` the clone's (so the clone's qbuild and plugins run),
``python -m qbuild build -j JOBS SEARCH``. The table gives, per search: the trial each
build chose, whether all builds agree, the winner's margin as the search's own
report.json states it (its speed ratio to float ± the measured noise, whether the choice
was inside the noise and what decided it), wall time per build and the 1-minute load
average before and after each build. ``--json FILE`` also writes every build's record.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ["//examples/yolo:yolo_auto"]
WALKTHROUGH = "docs/walkthrough.md:://classifier:mobilenet_auto"
_SETUP = re.compile(r"<!-- docs-test: setup -->\s*```sh\n(.*?)```", re.S)
_BLOCK = re.compile(r"<!-- docs-test: workspace: (\S+) -->\s*```toml\n(.*?)```", re.S)


def _docs_workspace(page: Path, label: str, clone: Path, where: Path) -> Path:
    """Make the page's workspace in ``where`` from ``clone`` as the page says; return its
    root with the BUILD.toml of ``label``'s package written up to the search's block."""
    text = page.read_text(encoding="utf-8")
    setup = _SETUP.search(text)
    if setup is None:
        raise SystemExit(f"{page}: no <!-- docs-test: setup --> block")
    script = re.sub(r"^QBUILD_REPO=\S+", f"QBUILD_REPO='{clone}'", setup.group(1),
                    count=1, flags=re.M)
    where.mkdir(parents=True)
    subprocess.run(["bash", "-euc", script], cwd=where, check=True)
    root = next(p.parent for p in where.rglob("qbuild.toml"))
    package, name = label[2:].split(":")
    file = f"{package}/BUILD.toml"
    blocks = [m.group(2) for m in _BLOCK.finditer(text) if m.group(1) == file]
    upto = next((i for i, b in enumerate(blocks)
                 if re.search(rf"^\[{re.escape(name)}\]", b, re.M)), None)
    if upto is None:
        raise SystemExit(f"{page}: no workspace block of {file} defines [{name}]")
    (root / file).write_text("\n".join(blocks[:upto + 1]), encoding="utf-8")
    return root


def _margin(report: dict[str, Any]) -> dict[str, Any]:
    """The winner's margin as the search states it: its ratio to float ± noise, the
    trials tied with it, what decided, and the fastest other passing trial."""
    chosen = report["chosen"]
    rows = {r["name"]: r for r in report["trials"]}
    row = rows.get(chosen) or report["float"]
    choice = report.get("latency_choice") or {}
    others = sorted((r for r in report["trials"] if r["passes"] and r["name"] != chosen
                     and r.get("relative_latency") is not None),
                    key=lambda r: (r["relative_latency"], r["name"]))
    return {"chosen": chosen, "ratio": row.get("relative_latency"),
            "noise": row.get("latency_noise"), "score": row.get("score"),
            "tied": choice.get("tied"), "decided_by": choice.get("decided_by"),
            "inside_noise": choice.get("inside_noise"),
            "passing": sum(1 for r in report["trials"] if r["passes"]),
            "trials": len(report["trials"]),
            "passing_trials": {r["name"]: r.get("score") for r in report["trials"]
                               if r["passes"]},
            "next": ({"name": others[0]["name"], "ratio": others[0]["relative_latency"],
                      "noise": others[0].get("latency_noise")} if others else None),
            "note": report.get("note")}


def build_once(search: str, jobs: int, keep: bool) -> dict[str, Any]:
    page, _, label = search.rpartition("::")
    tmp = Path(tempfile.mkdtemp(prefix="search_repro_"))
    clone, cache = tmp / "qbuild", tmp / "cache"
    cache.mkdir()
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    root = _docs_workspace(clone / page, label, clone, tmp / "ws") if page else clone
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("QBUILD_REMOTE", "QBUILD_CACHE"))}
    env.update(QBUILD_CACHE_DIR=str(cache),
               PYTHONPATH=os.pathsep.join([str(clone), str(clone / "plugins")]))
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "qbuild", "build", "-j", str(jobs), label],
                          cwd=root, env=env, capture_output=True, text=True)
    wall, load1 = time.perf_counter() - t0, os.getloadavg()[0]
    package, name = label[2:].split(":")
    record: dict[str, Any] = {"search": search, "wall_s": round(wall, 1),
                              "load_before": round(load0, 2), "load_after": round(load1, 2),
                              "exit": done.returncode, "folder": str(tmp)}
    report = root / "qbuild-out" / package / f"@{name}" / "report.json"
    if done.returncode == 0 and report.exists():
        record.update(_margin(json.loads(report.read_text())))
    else:
        record["chosen"] = f"FAILED (exit {done.returncode})"
        record["error"] = (done.stderr or done.stdout)[-2000:]
    if not keep:
        shutil.rmtree(tmp, ignore_errors=True)
    return record


def _fmt_margin(r: dict[str, Any]) -> str:
    if "error" in r:
        return r["error"].strip().splitlines()[-1][:200] if r["error"].strip() else "—"
    if r.get("chosen") == "float":
        s = f"float kept ({r.get('decided_by') or 'no trial passes'})"
    elif r.get("ratio") is None:
        return "—"
    else:
        s = f"{r['ratio']} ± {r['noise']}"
    if r.get("decided_by") and r.get("chosen") != "float":
        s += f", decided by {r['decided_by']}"
        if r.get("inside_noise"):
            s += f" (tied inside the noise: {', '.join(r['tied'] or [])})"
    if r.get("next"):
        n = r["next"]
        s += f"; fastest other {n['name']} {n['ratio']} ± {n['noise']}"
    return s


def table(records: list[dict[str, Any]]) -> str:
    lines = ["| search | build | chosen | trials passing | ratio to float ± noise (the "
             "search's report) | wall | load before → after |", "|---|---|---|---|---|---|---|"]
    by: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by.setdefault(r["search"], []).append(r)
    for search, rs in by.items():
        for i, r in enumerate(rs, 1):
            passing = f"{r.get('passing', '—')} of {r.get('trials', '?')}"
            lines.append(f"| `{search}` | {i} | `{r['chosen']}` | {passing} | "
                         f"{_fmt_margin(r)} | {r['wall_s']:.0f} s | "
                         f"{r['load_before']} → {r['load_after']} |")
        same = len({r["chosen"] for r in rs}) == 1
        sets = {tuple(sorted(r.get("passing_trials") or {})) for r in rs
                if "passing_trials" in r}
        lines.append(f"| `{search}` | all {len(rs)} | **{'same' if same else 'DIFFERENT'}** "
                     f"| {'' if not sets else 'same set' if len(sets) == 1 else 'sets differ'}"
                     f" | | | |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("searches", nargs="*")
    ap.add_argument("--all", action="store_true", help="the examples' and the walkthrough's")
    ap.add_argument("--builds", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", type=Path, help="also write every build's record here")
    ap.add_argument("--keep", action="store_true", help="keep the clones and caches")
    ap.add_argument("--table", type=Path, help="only print the table of a --json file")
    args = ap.parse_args()
    if args.table:
        print(table(json.loads(args.table.read_text())))
        return
    searches = args.searches or (DEFAULT + [WALKTHROUGH] if args.all else DEFAULT)
    records = []
    for search in searches:
        for i in range(args.builds):
            r = build_once(search, args.jobs, args.keep)
            records.append(r)
            print(f"{search} build {i + 1}: {r['chosen']} in {r['wall_s']} s "
                  f"(load {r['load_before']} -> {r['load_after']})", file=sys.stderr,
                  flush=True)
            if args.json:
                args.json.write_text(json.dumps(records, indent=1) + "\n")
    print(table(records))


if __name__ == "__main__":
    main()
