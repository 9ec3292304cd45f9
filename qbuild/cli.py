"""The ``qbuild`` command line: build, query, graph, explain, clean, cache, rules."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from . import __version__
from ._errors import QbuildError, UsageError

EXIT_OK, EXIT_BUILD_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message} (see 'qbuild {self.prog.split()[-1]} --help')"
                         if " " in self.prog else message)


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--verbose", action="store_true", help="show tracebacks on errors")
    parser = _Parser(prog="qbuild", description="Declarative, content-addressed builds of "
                     "ONNX model artifacts.", parents=[common])
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)

    build = sub.add_parser("build", parents=[common], help="build targets")
    build.add_argument("patterns", nargs="+", metavar="PATTERN")
    build.add_argument("-j", "--jobs", type=int, help="parallel actions (default: setting or "
                       "CPU count)")
    build.add_argument("-k", "--keep_going", action="store_true",
                       help="keep building what does not depend on a failure")
    build.add_argument("--explain", action="store_true", help="say why each action runs")
    build.add_argument("--event_log", metavar="FILE", help="write JSON-lines events to FILE")

    query = sub.add_parser("query", parents=[common], help="query the target graph")
    query.add_argument("expression")
    query.add_argument("--output", choices=["label", "json"], default="label")

    graph = sub.add_parser("graph", parents=[common], help="draw the target graph")
    graph.add_argument("patterns", nargs="+", metavar="PATTERN")
    graph.add_argument("--format", choices=["dot", "mermaid"], default="dot")

    explain = sub.add_parser("explain", parents=[common],
                             help="what changed since a target was last built")
    explain.add_argument("label")

    clean = sub.add_parser("clean", parents=[common], help="remove the output folder")
    clean.add_argument("--expunge", action="store_true", help="also delete the whole cache")

    cache = sub.add_parser("cache", parents=[common], help="inspect or shrink the cache")
    cache_sub = cache.add_subparsers(dest="cache_command", parser_class=_Parser)
    cache_sub.add_parser("stats", parents=[common], help="sizes and counts")
    gc = cache_sub.add_parser("gc", parents=[common], help="evict the oldest blobs")
    gc.add_argument("--max-size", "--max_size", dest="max_size", required=True,
                    help="e.g. 500M, 10G")

    rules = sub.add_parser("rules", parents=[common], help="list rules, or describe one")
    rules.add_argument("kind", nargs="?")
    return parser


def _size(text: str) -> int:
    units = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    cleaned = text.strip().upper().removesuffix("IB").removesuffix("B")
    number, unit = cleaned, ""
    if cleaned and cleaned[-1] in units:
        number, unit = cleaned[:-1], cleaned[-1]
    try:
        value = float(number)
    except ValueError:
        raise UsageError(f"bad size {text!r}: write e.g. 500M or 10G") from None
    if value < 0:
        raise UsageError(f"bad size {text!r}")
    return int(value * units[unit])


def _session() -> tuple[Any, str | None]:
    from ._build import Session
    from ._plugins import load_registry
    from ._workspace import load_workspace

    cwd = Path.cwd()
    workspace = load_workspace(cwd)
    try:
        package = workspace.package_of(cwd)
    except ValueError:
        package = None
    registry = load_registry(cache_file=workspace.cache_dir / "entry_points.json")
    return Session(workspace, registry), package


def _rel(path: Path) -> str:
    text, cwd = str(path), os.getcwd()
    if text.startswith(cwd + os.sep):  # the common case, without relpath's cost
        return text[len(cwd) + 1:]
    try:
        return os.path.relpath(path)
    except ValueError:
        return text


def _noop_package(workspace: Any) -> str | None:
    try:
        return workspace.package_of(Path.cwd())
    except ValueError:
        return None


def cmd_build(args: argparse.Namespace) -> int:
    import time

    from ._noop import environment, try_noop
    from ._workspace import load_workspace

    workspace = load_workspace(Path.cwd())
    if not args.explain and not args.event_log:
        snapshot = try_noop(workspace.root, workspace.output_dir, args.patterns,
                            _noop_package(workspace))
        if snapshot is not None:
            if snapshot["lines"]:
                sys.stdout.write("\n".join(_rel(workspace.root / line)
                                           for line in snapshot["lines"]) + "\n")
            summary = snapshot["summary"]
            print(f"Build OK: {summary['targets']} targets, 0 actions run, "
                  f"{summary['actions']} cache hits (nothing changed)", file=sys.stderr)
            return EXIT_OK
    _make_folders(workspace)
    return _full_build(args, time.time(), environment())


def _make_folders(workspace: Any) -> None:
    """Create the output and cache folders before the build starts: creating them
    changes their parent directory, which the build may list (and the fast path would
    then refuse to vouch for a directory modified during the build)."""
    import time

    created = False
    for folder in (workspace.output_dir, workspace.cache_dir):
        if not folder.is_dir():
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError:
                continue  # reported where the folder is used
            created = True
    if created:
        from ._digest import granularity

        st = os.stat(workspace.output_dir.parent)
        time.sleep(granularity(st.st_mtime_ns, st.st_ctime_ns))


def _full_build(args: argparse.Namespace, started: float, env: dict[str, Any]) -> int:
    from ._build import Build, BuildOptions
    from ._executor import clean_stale_sandboxes
    from ._noop import forget, record
    from ._progress import ConsoleReporter, EventLogReporter, FanOut, Reporter

    session, package = _session()
    try:
        jobs = args.jobs if args.jobs is not None else session.workspace.jobs
        if jobs < 1:
            raise UsageError("-j must be at least 1")
        forget(session.workspace.output_dir, args.patterns, package)
        labels = session.graph.expand(args.patterns, package)
        reporters: list[Reporter] = [ConsoleReporter()]
        if args.event_log:
            reporters.append(EventLogReporter(args.event_log))
        reporter = FanOut(*reporters)
        clean_stale_sandboxes(session.store.tmp)
        build = Build(session, BuildOptions(jobs=jobs, keep_going=args.keep_going,
                                            explain=args.explain), reporter)
        result = build.run(labels)
        lines, shown = [], []
        root_prefix = len(str(session.workspace.root)) + 1
        for label in result.requested:
            for path in result.outputs.get(label, []):
                shown.append(_rel(path))
                lines.append(str(path)[root_prefix:].replace(os.sep, "/"))
        if shown:
            sys.stdout.write("\n".join(shown) + "\n")
        reads = build.reads()
        if result.ok and reads is not None:
            record(session.workspace.root, session.workspace.output_dir, args.patterns,
                   package, reads=reads, outputs=build.placed_outputs(), started=started,
                   env=env, lines=lines,
                   summary={"targets": len(result.requested),
                            "actions": len(result.ran) + len(result.cached)})
        return EXIT_OK if result.ok else EXIT_BUILD_FAILED
    finally:
        session.close()


def cmd_query(args: argparse.Namespace) -> int:
    from ._query import Query

    session, package = _session()
    labels = Query(session.graph, package).evaluate(args.expression)
    if args.output == "json":
        records = []
        for label in labels:
            target = session.graph.targets[label]
            records.append({"label": str(label), "kind": target.kind,
                            "deps": [str(d) for d in target.deps],
                            "build_file": target.build_file})
        print(json.dumps(records, indent=2))
    else:
        for label in labels:
            print(label)
    return EXIT_OK


def cmd_graph(args: argparse.Namespace) -> int:
    from ._graphviz import render

    session, package = _session()
    roots = session.graph.expand(args.patterns, package)
    order = session.graph.analyze(roots)
    sys.stdout.write(render(session.graph, order, args.format))
    return EXIT_OK


def cmd_explain(args: argparse.Namespace) -> int:
    from ._explain import explain
    from ._label import parse_label

    session, package = _session()
    try:
        label = parse_label(args.label, package)
        session.graph.expand([str(label)], package)
        for line in explain(session, label):
            print(line)
    finally:
        session.close()
    return EXIT_OK


def cmd_clean(args: argparse.Namespace) -> int:
    from ._workspace import load_workspace

    workspace = load_workspace(Path.cwd())
    shutil.rmtree(workspace.output_dir, ignore_errors=True)
    print(f"removed {_rel(workspace.output_dir)}")
    if args.expunge:
        shutil.rmtree(workspace.cache_dir, ignore_errors=True)
        print(f"removed the cache {workspace.cache_dir}")
    return EXIT_OK


def cmd_cache(args: argparse.Namespace) -> int:
    from ._store import LocalStore
    from ._workspace import load_workspace

    if args.cache_command is None:
        raise UsageError("say 'qbuild cache stats' or 'qbuild cache gc --max-size SIZE'")
    workspace = load_workspace(Path.cwd())
    store = LocalStore(workspace.cache_dir)
    try:
        if args.cache_command == "stats":
            for key, value in store.stats().items():
                print(f"{key}: {value}")
        else:
            outcome = store.gc(_size(args.max_size))
            print(f"cache blobs: {outcome['before']} -> {outcome['after']} bytes "
                  f"({outcome['removed']} removed, {outcome['orphans']} orphan files "
                  "reclaimed)")
    finally:
        store.close()
    return EXIT_OK


def cmd_rules(args: argparse.Namespace) -> int:
    from ._plugins import load_registry

    registry = load_registry()
    if args.kind is None:
        width = max((len(k) for k in registry.kinds()), default=0)
        for kind in registry.kinds():
            entry = registry.entries[kind]
            first = (entry.cls.doc or entry.cls.__doc__ or "").strip().split("\n")[0]
            print(f"{kind:<{width}}  {first}  [{entry.dist} {entry.dist_version}]")
        return EXIT_OK
    entry = registry.get(args.kind)
    if entry is None:
        raise UsageError(f"no rule '{args.kind}' (known: {', '.join(registry.kinds())})")
    cls = entry.cls
    print(f"rule {cls.kind} (version {cls.version}, from {entry.dist} {entry.dist_version})")
    print()
    print((cls.doc or cls.__doc__ or "").strip())
    print()
    outputs = ", ".join(cls.outputs) or "depends on attributes"
    print(f"outputs: {outputs}")
    print("attributes:")
    for name, schema in cls.attrs.items():
        print(f"  {name}: {schema.type_name()} (default: {schema.describe_default()})")
        if schema.doc:
            print(f"      {schema.doc}")
    return EXIT_OK


_COMMANDS = {"build": cmd_build, "query": cmd_query, "graph": cmd_graph,
             "explain": cmd_explain, "clean": cmd_clean, "cache": cmd_cache,
             "rules": cmd_rules}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``qbuild`` console script; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["--version"], ["-V"]):
        print(f"qbuild {__version__}")
        return EXIT_OK
    verbose = "--verbose" in argv
    try:
        args = _parser().parse_args(argv)
        if args.version:
            print(f"qbuild {__version__}")
            return EXIT_OK
        if args.command is None:
            raise UsageError("no command given; try 'qbuild build //...' or 'qbuild --help'")
        return _COMMANDS[args.command](args)
    except QbuildError as exc:
        if verbose:
            import traceback

            traceback.print_exc()
        print(f"ERROR: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        _interrupted()
    except RecursionError:
        print("ERROR: input nested too deeply (a TOML value, a query or a dependency "
              "chain); flatten it", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        return EXIT_OK
    except Exception as exc:  # a bug: still one line unless --verbose
        if verbose:
            raise
        print(f"ERROR: internal error: {type(exc).__name__}: {exc} (rerun with --verbose "
              "and report it)", file=sys.stderr)
        return EXIT_BUILD_FAILED
    return EXIT_OK


def _interrupted() -> None:
    """Ctrl-C: end every process the build started and exit 130 at once, without
    waiting for the threads still running actions."""
    from ._executor import kill_children

    kill_children()
    print("interrupted", file=sys.stderr)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(EXIT_INTERRUPTED)


if __name__ == "__main__":
    raise SystemExit(main())
