"""The ``qbuild`` command line: build, query, graph, explain, clean, cache, rules,
outputs. ``--quiet`` and ``--verbose`` mean the same everywhere: results go to stdout,
messages to stderr; quiet leaves only results and errors, verbose adds detail."""

from __future__ import annotations

import argparse
import json
import os
import shlex
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
    # SUPPRESS: a flag given before the command is not reset by the subcommand's default.
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="more detail: tracebacks on errors, every action and warning")
    common.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                        help="only results and errors: no progress, summary or warnings")
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
    query.add_argument("--output", choices=["label", "json", "build"], default="label",
                       help="label: one per line; json: records with attributes; build: "
                       "the targets as BUILD.toml tables, matrix variants expanded")

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

    outputs = sub.add_parser("outputs", parents=[common],
                             help="the output paths of targets, one per line (for scripts)")
    outputs.add_argument("patterns", nargs="+", metavar="PATTERN")
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
    try:
        return os.path.relpath(path)
    except ValueError:
        return str(path)


def _shown(path: Path) -> str:
    """An output path as ``qbuild build`` prints it: quoted for the shell when needed
    (matrix variants' folders hold ``@``, ``=`` and ``,``)."""
    return shlex.quote(_rel(path))


def _info(args: argparse.Namespace, text: str) -> None:
    """A message for the user (not a result): on stderr, silenced by --quiet."""
    if not getattr(args, "quiet", False):
        print(text, file=sys.stderr)


def _noop_package(workspace: Any) -> str | None:
    try:
        return workspace.package_of(Path.cwd())
    except ValueError:
        return None


def cmd_build(args: argparse.Namespace) -> int:
    from ._noop import try_noop

    if not args.explain and not args.event_log:
        from ._workspace import load_workspace

        workspace = load_workspace(Path.cwd())
        snapshot = try_noop(workspace.output_dir, args.patterns, _noop_package(workspace))
        if snapshot is not None:
            for line in snapshot["lines"]:
                print(_shown(workspace.root / line))
            summary = snapshot["summary"]
            line = (f"Build OK: {summary['targets']} targets, 0 actions run, "
                    f"{summary['actions']} cache hits (nothing changed)")
            if summary.get("cache_dir"):
                from ._progress import human_size, short_path

                line += f"; cache {short_path(summary['cache_dir'])}"
                if not os.path.isdir(summary["cache_dir"]):
                    line += " (removed since the last full build)"
                elif summary.get("cache_bytes") is not None:
                    line += f" ({human_size(summary['cache_bytes'])} at the last full build)"
            _info(args, line)
            return EXIT_OK
    return _full_build(args)


def _full_build(args: argparse.Namespace) -> int:
    from ._build import Build, BuildOptions
    from ._executor import clean_stale_sandboxes
    from ._noop import record
    from ._progress import ConsoleReporter, EventLogReporter, FanOut, Reporter

    session, package = _session()
    try:
        jobs = args.jobs if args.jobs is not None else session.workspace.jobs
        if jobs < 1:
            raise UsageError("-j must be at least 1")
        labels = session.graph.expand(args.patterns, package)
        reporters: list[Reporter] = [ConsoleReporter(quiet=getattr(args, "quiet", False),
                                                     verbose=getattr(args, "verbose", False))]
        if args.event_log:
            reporters.append(EventLogReporter(args.event_log))
        reporter = FanOut(*reporters)
        clean_stale_sandboxes(session.store.tmp)
        build = Build(session, BuildOptions(jobs=jobs, keep_going=args.keep_going,
                                            explain=args.explain), reporter)
        result = build.run(labels)
        lines = []
        for label in result.requested:
            for path in result.outputs.get(label, []):
                print(_shown(path))
                lines.append(path.relative_to(session.workspace.root).as_posix())
        if result.ok and not session.graph.deep_globs:
            from ._executor import label_dir

            prefixes = tuple(label_dir(label) + "/" for label in result.requested)
            outputs = [str(session.workspace.output_dir / rel) for rel in
                       build.state.materialized if rel.startswith(prefixes)]
            record(session.workspace.output_dir, args.patterns, package,
                   session.graph.watched_files() + outputs, lines,
                   {"targets": len(result.requested),
                    "actions": len(result.ran) + len(result.cached),
                    "cache_dir": str(session.store.directory),
                    "cache_bytes": session.store.volume()})
        return EXIT_OK if result.ok else EXIT_BUILD_FAILED
    finally:
        session.close()


def cmd_query(args: argparse.Namespace) -> int:
    from ._query import Query
    from ._query_output import as_build, as_records

    session, package = _session()
    labels = Query(session.graph, package).evaluate(args.expression)
    if args.output == "json":
        print(json.dumps(as_records(session.graph, labels), indent=2))
    elif args.output == "build":
        sys.stdout.write(as_build(session.graph, labels))
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
    _info(args, f"removed {_rel(workspace.output_dir)}")
    if args.expunge:
        shutil.rmtree(workspace.cache_dir, ignore_errors=True)
        _info(args, f"removed the cache {workspace.cache_dir}")
    return EXIT_OK


def cmd_cache(args: argparse.Namespace) -> int:
    from ._store import LocalStore
    from ._workspace import load_workspace

    if args.cache_command is None:
        raise UsageError("say 'qbuild cache stats' or 'qbuild cache gc --max-size SIZE'")
    from ._progress import human_size

    workspace = load_workspace(Path.cwd())
    if not workspace.cache_dir.is_dir():  # expunged or never used: do not create it
        if args.cache_command == "gc":
            _size(args.max_size)
        print(f"directory: {workspace.cache_dir}\nno cache there (nothing built yet, or "
              "expunged): 0 B")
        return EXIT_OK
    store = LocalStore(workspace.cache_dir)
    try:
        if args.cache_command == "stats":
            for key, value in store.stats().items():
                shown = human_size(value) if key.endswith("bytes") else value
                print(f"{key}: {shown}")
        else:
            outcome = store.gc(_size(args.max_size))
            print(f"cache blobs: {human_size(outcome['before'])} -> "
                  f"{human_size(outcome['after'])} ({outcome['removed']} blobs removed)")
    finally:
        store.close()
    return EXIT_OK


def cmd_outputs(args: argparse.Namespace) -> int:
    from ._outputs import declared_paths

    session, package = _session()
    for path in declared_paths(session, args.patterns, package):
        print(_rel(path))
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
        when = f"; {schema.describe_when()}" if schema.when else ""
        print(f"  {name}: {schema.type_name()} (default: {schema.describe_default()}{when})")
        if schema.doc:
            print(f"      {schema.doc}")
    return EXIT_OK


_COMMANDS = {"build": cmd_build, "query": cmd_query, "graph": cmd_graph,
             "explain": cmd_explain, "clean": cmd_clean, "cache": cmd_cache,
             "rules": cmd_rules, "outputs": cmd_outputs}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``qbuild`` console script; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["--version"], ["-V"]):
        print(f"qbuild {__version__}")
        return EXIT_OK
    verbose = "--verbose" in argv or "-v" in argv
    try:
        args = _parser().parse_args(argv)
        if getattr(args, "quiet", False) and getattr(args, "verbose", False):
            raise UsageError("--quiet and --verbose contradict each other; give one")
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
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
