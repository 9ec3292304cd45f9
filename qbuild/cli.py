"""The ``qbuild`` command line: build, query, aquery, graph, explain, log, clean, cache, rules,
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
from typing import TYPE_CHECKING, Any

from .core.errors import QbuildError, UsageError
from .core.versions import __version__

if TYPE_CHECKING:
    from .analysis.workspace import Workspace
    from .build.session import Session

EXIT_OK, EXIT_BUILD_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
REMOTE_JOBS = 64  # default -j with --remote_executor (actions in flight, as Bazel's advice)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message} (see 'qbuild {self.prog.split()[-1]} --help')"
                         if " " in self.prog else message)


def _parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    # SUPPRESS: a flag given before the command is not reset by the subcommand's default.
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="more detail: tracebacks on errors, every action and warning")
    common.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                        help="only results and errors: no progress, summary or warnings")
    common.add_argument("-p", dest="plugin_options", action="append", metavar="no:NAME",
                        default=argparse.SUPPRESS,
                        help="do not load the plugin NAME (repeatable; qbuild.toml: "
                        '[settings] plugins = ["no:NAME"])')
    remote = _Parser(add_help=False)
    group = remote.add_argument_group("remote cache (Bazel's HTTP protocol)")
    group.add_argument("--remote_cache", metavar="URL", help="http(s)://host:port[/prefix] "
                       "of a shared cache (default: $QBUILD_REMOTE_CACHE, then [remote] "
                       "cache in qbuild.toml); empty turns it off")
    group.add_argument("--remote_upload_local_results", action="store_true",
                       dest="remote_upload", default=None,
                       help="upload results of actions run here (the default; "
                       "=false is the same as --noremote_upload_local_results)")
    group.add_argument("--noremote_upload_local_results", action="store_false",
                       dest="remote_upload", default=None,
                       help="read from the remote cache, never write to it")
    group.add_argument("--remote_header", action="append", metavar="NAME=VALUE",
                       help="an HTTP header sent with every request (repeatable)")
    group.add_argument("--remote_timeout", type=float, metavar="SECONDS",
                       help="give up on a request after this long (default: 60)")
    parser = _Parser(prog="qbuild", description="Declarative, content-addressed builds of "
                     "ONNX model artifacts.", parents=[common])
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)

    build = sub.add_parser("build", parents=[common, remote], help="build targets")
    build.add_argument("patterns", nargs="+", metavar="PATTERN")
    build.add_argument("-j", "--jobs", type=int, help="parallel actions (default: setting or "
                       "CPU count)")
    build.add_argument("-k", "--keep_going", action="store_true",
                       help="keep building what does not depend on a failure")
    build.add_argument("--explain", action="store_true", help="say why each action runs")
    build.add_argument("--event_log", metavar="FILE", help="write JSON-lines events to FILE")
    build.add_argument("--toolchain_mismatch", choices=["error", "warn"], default="error",
                       help="what to do when installed versions differ from qbuild.toml's "
                       "[toolchain] pins (default: error, exit 2)")
    executing = build.add_argument_group("remote execution (a Dask cluster; needs a remote "
                                         "cache, see docs/distributed.md)")
    executing.add_argument("--remote_executor", metavar="dask://HOST:PORT",
                           help="run actions on the Dask scheduler at this address (default: "
                           "$QBUILD_REMOTE_EXECUTOR, then [remote] executor in qbuild.toml); "
                           "empty turns it off")
    executing.add_argument("--remote_local_fallback", action="store_true", default=None,
                           help="run actions here when the scheduler cannot be reached, "
                           "no worker fits them, or every worker refuses them")
    executing.add_argument("--strategy", action="append", default=[], metavar="KIND=WHERE",
                           help="where actions of a rule kind run: remote or local (KIND * "
                           "for all unlisted kinds; default: heavy rules remote, light local)")
    build.add_argument("--local_resources", action="append", default=[], metavar="KIND=N",
                       help="cores (cpu=4) or memory (memory=8G; plain numbers are MiB) "
                       "running actions may use together (default: all cores, 2/3 of RAM)")

    query = sub.add_parser("query", parents=[common], help="query the target graph")
    query.add_argument("expression")
    query.add_argument("--output", choices=["label", "json", "build"], default="label",
                       help="label: one per line; json: records with attributes; build: "
                       "the targets as BUILD.toml tables, matrix variants expanded")

    aquery = sub.add_parser("aquery", parents=[common],
                            help="list the actions of targets: inputs, outputs, keys")
    aquery.add_argument("patterns", nargs="+", metavar="PATTERN")
    aquery.add_argument("--output", choices=["text", "json"], default="text")

    log = sub.add_parser("log", parents=[common, remote],
                         help="the log of the last run of each action of targets")
    log.add_argument("patterns", nargs="+", metavar="PATTERN")

    graph = sub.add_parser("graph", parents=[common], help="draw the target graph")
    graph.add_argument("patterns", nargs="+", metavar="PATTERN")
    graph.add_argument("--format", choices=["dot", "mermaid"], default="dot")

    explain = sub.add_parser("explain", parents=[common, remote],
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

    info = sub.add_parser("info", parents=[common], help="toolchain, Python, platform, "
                          "cache and plugins in force")
    info.add_argument("--plugins", action="store_true", help="only the plugins: each with "
                      "its distribution, version, module file, rules and hooks")

    rules = sub.add_parser("rules", parents=[common], help="list rules, or describe one")
    rules.add_argument("kind", nargs="?")

    outputs = sub.add_parser("outputs", parents=[common],
                             help="the output paths of targets, one per line (for scripts)")
    outputs.add_argument("patterns", nargs="+", metavar="PATTERN")
    return parser


def _bool_flags(argv: list[str]) -> list[str]:
    """Bazel's ``--flag=true|false`` spelling of boolean flags."""
    out = []
    for arg in argv:
        name, sep, value = arg.partition("=")
        if sep and name == "--remote_upload_local_results":
            word = value.strip().lower()
            if word in ("1", "true", "yes"):
                arg = name
            elif word in ("0", "false", "no"):
                arg = "--noremote_upload_local_results"
            else:
                raise UsageError(f"{name} takes true or false, not {value!r}")
        out.append(arg)
    return out


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


def _local_resources(items: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        kind, _, value = item.partition("=")
        kind = kind.strip().lower()
        try:
            if kind == "cpu":
                out["cpu"] = int(value)
            elif kind == "memory":
                text = value.strip()
                out["memory"] = int(text) if text.isdigit() else _size(text) >> 20
            else:
                raise ValueError
        except ValueError:
            raise UsageError(f"bad --local_resources {item!r}: write cpu=N or memory=SIZE "
                             "(e.g. memory=8G)") from None
        if out[kind] < 1:
            raise UsageError(f"--local_resources {item!r} must be at least 1")
    return out



def _blocked(args: argparse.Namespace) -> tuple[str, ...]:
    """The plugins ``-p no:NAME`` blocks."""
    from .analysis.workspace import blocked_plugins
    from .core.errors import ConfigError

    try:
        return blocked_plugins(list(getattr(args, "plugin_options", None) or []))
    except ConfigError as exc:
        raise UsageError(f"-p: {exc}") from None


def _session(args: argparse.Namespace) -> tuple[Session, str | None]:
    """The session of the current directory's workspace, as the flags configure it."""
    from .build.session import Session

    remote_flags = None
    if hasattr(args, "remote_cache"):
        remote_flags = {"cache": args.remote_cache, "upload": args.remote_upload,
                        "timeout": args.remote_timeout, "headers": args.remote_header}
    return Session.open(Path.cwd(), remote_flags=remote_flags, blocked=_blocked(args))


def _rel(path: Path | str, cwd: str | None = None) -> str:
    """``path`` relative to ``cwd`` (default: the current directory's, asked now)."""
    text = str(path)
    if cwd is None:
        cwd = os.getcwd()
    if text.startswith(cwd + os.sep):  # the common case, without relpath's cost
        return text[len(cwd) + 1:]
    try:
        return os.path.relpath(path)
    except ValueError:
        return text


def _shown(path: Path | str, cwd: str | None = None) -> str:
    """An output path as ``qbuild build`` prints it: quoted for the shell when needed
    (matrix variants' folders hold ``@``, ``=`` and ``,``)."""
    return shlex.quote(_rel(path, cwd))


def _info(args: argparse.Namespace, text: str) -> None:
    """A message for the user (not a result): on stderr, silenced by --quiet."""
    if not getattr(args, "quiet", False):
        print(text, file=sys.stderr)


def _noop_package(workspace: Workspace) -> str | None:
    try:
        return workspace.package_of(Path.cwd())
    except ValueError:
        return None


def _check_remote_flags(args: argparse.Namespace) -> None:
    """Syntax of the --remote_* flags, without importing the HTTP client."""
    if args.remote_cache and args.remote_cache.partition("://")[0] not in ("http", "https"):
        raise UsageError("bad remote cache URL: it must look like http(s)://host[:port][/prefix]")
    for item in args.remote_header or []:
        name, sep, _ = item.partition("=")
        if not sep or not name.strip() or any(c in name for c in ": \r\n"):
            # The value may be a secret: never echo it.
            raise UsageError("--remote_header must be Name=Value")
    if args.remote_timeout is not None and not args.remote_timeout > 0:
        raise UsageError("--remote_timeout must be a positive number of seconds")


def cmd_build(args: argparse.Namespace) -> int:
    import time

    from .analysis.workspace import load_workspace
    from .shortcuts.noop import environment, try_noop

    _check_remote_flags(args)  # even when the fast path answers: a typo must not pass
    workspace = load_workspace(Path.cwd())
    if not args.explain and not args.event_log:
        snapshot = try_noop(workspace.root, workspace.output_dir, args.patterns,
                            _noop_package(workspace), _options_digest(args),
                            args.toolchain_mismatch)
        if snapshot is not None:
            for warning in snapshot["summary"]["warnings"]:
                print(warning, file=sys.stderr)
            if snapshot["lines"]:
                cwd = os.getcwd()
                sys.stdout.write("\n".join(_shown(workspace.root / line, cwd)
                                           for line in snapshot["lines"]) + "\n")
            summary = snapshot["summary"]
            line = (f"Build OK: {summary['targets']} targets, 0 actions run, "
                    f"{summary['actions']} cache hits (nothing changed)")
            if summary.get("cache_dir"):
                from .build.progress import human_size, short_path

                line += f"; cache {short_path(summary['cache_dir'])}"
                if not os.path.isdir(summary["cache_dir"]):
                    line += " (removed since the last full build)"
                elif summary.get("cache_bytes") is not None:
                    line += f" ({human_size(summary['cache_bytes'])} at the last full build)"
            _info(args, line)
            return EXIT_OK
    _make_folders(workspace)
    return _full_build(args, time.time(), environment(_options_digest(args)))


def _options_digest(args: argparse.Namespace) -> str:
    """A digest of the settings outside the workspace that change what a build does (the
    remote cache and how it is used): the fast path answers only when they are the last
    build's. Hashed, so no credential in a header or URL is ever written down."""
    import hashlib

    settings = [getattr(args, name, None) for name in
                ("remote_cache", "remote_upload", "remote_header", "remote_timeout",
                 "plugin_options")]
    settings += [os.environ.get(name) for name in
                 ("QBUILD_REMOTE_CACHE", "SSL_CERT_FILE", "SSL_CERT_DIR")]
    return hashlib.sha256(json.dumps(settings, default=str).encode()).hexdigest()


def _make_folders(workspace: Workspace) -> None:
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
        from .core.files import granularity

        st = os.stat(workspace.output_dir.parent)
        time.sleep(granularity(st.st_mtime_ns, st.st_ctime_ns))


def _full_build(args: argparse.Namespace, started: float, env: dict[str, Any]) -> int:
    from .build.progress import ConsoleReporter, EventLogReporter, FanOut, Reporter
    from .build.run import BuildOptions
    from .commands.build import BuildRequest, full_build

    session, package = _session(args)
    try:
        executor: Any = None
        if args.remote_executor is not None or session.workspace.has_remote or \
                "QBUILD_REMOTE_EXECUTOR" in os.environ:  # (else nothing names one)
            from .execution.dask_executor import resolve_executor

            executor = resolve_executor(session.workspace.root, {
                "executor": args.remote_executor,
                "local_fallback": args.remote_local_fallback, "strategy": args.strategy})
        if executor is not None and session.remote is None:
            raise UsageError("--remote_executor needs a remote cache (the workers' only way "
                             "to get inputs and return outputs): give --remote_cache=URL, "
                             "$QBUILD_REMOTE_CACHE or [remote] cache in qbuild.toml")
        jobs = args.jobs if args.jobs is not None else session.workspace.jobs
        if args.jobs is None and executor is not None:
            jobs = max(jobs, REMOTE_JOBS)  # the cluster queues and places them
        if jobs < 1:
            raise UsageError("-j must be at least 1")
        resources = _local_resources(args.local_resources)
        reporters: list[Reporter] = [ConsoleReporter(quiet=getattr(args, "quiet", False),
                                                     verbose=getattr(args, "verbose", False))]
        if args.event_log:
            reporters.append(EventLogReporter(args.event_log))
        request = BuildRequest(
            args.patterns, package,
            BuildOptions(jobs=jobs, keep_going=args.keep_going, explain=args.explain,
                         remote_executor=executor, **resources),
            started=started, environment=env, toolchain_mismatch=args.toolchain_mismatch)
        run = full_build(session, request, FanOut(*reporters),
                         lambda line: print(line, file=sys.stderr))
        if run.paths:
            cwd = os.getcwd()
            sys.stdout.write("\n".join(_shown(path, cwd) for path in run.paths) + "\n")
        return EXIT_OK if run.build.result.ok else EXIT_BUILD_FAILED
    finally:
        session.close()


def cmd_query(args: argparse.Namespace) -> int:
    from .commands.query import Query
    from .commands.query_output import as_build, as_records

    session, package = _session(args)
    labels = Query(session.graph, package).evaluate(args.expression)
    if args.output == "json":
        print(json.dumps(as_records(session.graph, labels), indent=2))
    elif args.output == "build":
        sys.stdout.write(as_build(session.graph, labels))
    else:
        for label in labels:
            print(label)
    return EXIT_OK


def cmd_aquery(args: argparse.Namespace) -> int:
    from .commands.aquery import actions, as_text

    session, package = _session(args)
    try:
        records = actions(session, session.graph.expand(args.patterns, package))
    finally:
        session.close()
    if args.output == "json":
        print(json.dumps(records, indent=2))
    else:
        sys.stdout.write(as_text(records))
    return EXIT_OK


def cmd_log(args: argparse.Namespace) -> int:
    from .commands.log import action_logs

    session, package = _session(args)
    try:
        logs = action_logs(session, session.graph.expand(args.patterns, package))
    finally:
        session.close()
    for entry in logs:
        if entry.text is None:
            print(f"qbuild log: {entry.target}: action {entry.mnemonic}: {entry.note}",
                  file=sys.stderr)
            continue
        print(f"=== {entry.target}: action {entry.mnemonic}"
              + (f" ({entry.note})" if entry.note else "") + " ===")
        sys.stdout.write(entry.text)
    return EXIT_BUILD_FAILED if any(e.text is None for e in logs) else EXIT_OK


def cmd_graph(args: argparse.Namespace) -> int:
    from .commands.graphviz import render

    session, package = _session(args)
    roots = session.graph.expand(args.patterns, package)
    order = session.graph.analyze(roots)
    sys.stdout.write(render(session.graph, order, args.format))
    return EXIT_OK


def cmd_explain(args: argparse.Namespace) -> int:
    from .commands.explain import explain
    from .core.labels import parse_label

    session, package = _session(args)
    try:
        label = parse_label(args.label, package)
        session.graph.expand([str(label)], package)
        for line in explain(session, label):
            print(line)
    finally:
        session.close()
    return EXIT_OK


def cmd_clean(args: argparse.Namespace) -> int:
    from .analysis.workspace import CACHE_ENTRIES, load_workspace
    from .build.materialize import clean_output_dir

    workspace = load_workspace(Path.cwd())  # refuses folders qbuild does not own
    removed = clean_output_dir(workspace.output_dir)
    _info(args, f"removed {removed}" if removed is not None
          else f"nothing to remove: no {_rel(workspace.output_dir)}")
    if args.expunge:
        cache = workspace.cache_dir
        made = [cache / name for name in CACHE_ENTRIES]
        # Indexes the store set aside as damaged are its own too.
        made += [p for name in ("ac", "cas", "memo") for p in cache.glob(f"{name}.damaged-*")]
        for path in made:  # only what the store made, never the folder's other files
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            elif path.exists() or path.is_symlink():
                path.unlink()
        try:
            cache.rmdir()
        except OSError:
            pass
        _info(args, f"removed the cache {cache}")
    return EXIT_OK


def cmd_cache(args: argparse.Namespace) -> int:
    from .analysis.workspace import load_workspace
    from .store.local import LocalStore

    if args.cache_command is None:
        raise UsageError("say 'qbuild cache stats' or 'qbuild cache gc --max-size SIZE'")
    from .build.progress import human_size

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
                  f"{human_size(outcome['after'])} ({outcome['removed']} blobs removed, "
                  f"{outcome['orphans']} orphan files reclaimed)")
    finally:
        store.close()
    return EXIT_OK


def cmd_info(args: argparse.Namespace) -> int:
    from .analysis.plugins import load_registry
    from .analysis.workspace import load_workspace
    from .commands.info import info_lines, plugin_lines

    workspace = load_workspace(Path.cwd())
    registry = load_registry(blocked=[*workspace.blocked_plugins, *_blocked(args)])
    for line in (plugin_lines(registry) if args.plugins else info_lines(workspace, registry)):
        print(line)
    return EXIT_OK


def cmd_outputs(args: argparse.Namespace) -> int:
    from .commands.outputs import declared_paths

    session, package = _session(args)
    for path in declared_paths(session, args.patterns, package):
        print(_rel(path))
    return EXIT_OK


def cmd_rules(args: argparse.Namespace) -> int:
    from .analysis.plugins import load_registry

    registry = load_registry(blocked=_blocked(args))
    if args.kind is None:
        width = max((len(k) for k in registry.kinds()), default=0)
        for kind in registry.kinds():
            entry = registry.entries[kind]
            first = (entry.cls.doc or entry.cls.__doc__ or "").strip().split("\n")[0]
            missing = entry.cls.missing_requirements()
            note = (f"  (unavailable: needs {', '.join(missing)}; "
                    f"{entry.cls.install_hint or 'pip install ' + ' '.join(missing)})"
                    if missing else "")
            print(f"{kind:<{width}}  {first}  [{entry.dist} {entry.dist_version}]{note}")
        return EXIT_OK
    found = registry.get(args.kind)
    if found is None:
        raise UsageError(f"no rule '{args.kind}' (known: {', '.join(registry.kinds())})")
    entry = found
    cls = entry.cls
    print(f"rule {cls.kind} (version {cls.version}, from {entry.dist} {entry.dist_version})")
    print()
    print((cls.doc or cls.__doc__ or "").strip())
    print()
    outputs = ", ".join(cls.outputs) or "depends on attributes"
    print(f"outputs: {outputs}")
    print("machine-dependent: " + ("yes (keyed by CPU architecture and instruction sets; "
                                   "not shared with other machine classes)"
                                   if cls.machine_dependent else "no (shareable across machines)"))
    print("provides: " + ", ".join(["DefaultInfo", *(p.__qualname__ for p in cls.provides)])
          + ("" if cls.is_v2() or cls.provides else " (v1 rule: not checked at analysis)"))
    if cls.requires:
        missing = cls.missing_requirements()
        print(f"requires: {', '.join(cls.requires)}" + (
            f" (missing: {', '.join(missing)}; {cls.install_hint})" if missing else ""))
    print("attributes:")
    for name, schema in cls.attrs.items():
        when = f"; {schema.describe_when()}" if schema.when else ""
        if schema.providers:
            when += "; must provide " + ", ".join(p.__qualname__ for p in schema.providers)
        print(f"  {name}: {schema.type_name()} (default: {schema.describe_default()}{when})")
        if schema.doc:
            print(f"      {schema.doc}")
    return EXIT_OK


_COMMANDS = {"build": cmd_build, "query": cmd_query, "graph": cmd_graph, "info": cmd_info,
             "explain": cmd_explain, "clean": cmd_clean, "cache": cmd_cache,
             "rules": cmd_rules, "outputs": cmd_outputs, "aquery": cmd_aquery,
             "log": cmd_log}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``qbuild`` console script; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["--version"], ["-V"]):
        print(f"qbuild {__version__}")
        return EXIT_OK
    verbose = "--verbose" in argv or "-v" in argv
    _tune_gc()
    try:
        args = _parser().parse_args(_bool_flags(argv))
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


def run() -> None:
    """The ``qbuild`` command (console script and ``python -m qbuild``): ``main``, then
    exit without tearing the interpreter down."""
    code = main()
    _exit(code)


def _exit(code: int) -> None:
    """Exit with ``code`` at once once the command is done: freeing every object a build
    of many targets made (analysed targets, results, records) one by one costs about a
    tenth of a no-op build, for nothing. Exit handlers run and the standard streams are
    flushed first; if a thread other than daemons is still alive (a plugin's), the
    ordinary exit waits for it as usual."""
    import atexit
    import threading

    if any(not thread.daemon for thread in threading.enumerate()
           if thread is not threading.main_thread()):
        raise SystemExit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BrokenPipeError:
            pass  # the reader left (``qbuild query ... | head``): as main() treats it
        except (OSError, ValueError):
            code = code or 120  # what Python's own exit gives when a flush fails
    os._exit(code)


def _tune_gc() -> None:
    """Collect cycles less often in this short-lived process. A build holds a few
    long-lived objects per target (analysed targets, results, state records), and with
    the default thresholds (700, 10, 10) the collector walks all of them again and
    again: 1.5 s of a 3 s no-op build at 10,000 targets (and an older generation holds
    a million survivors after 20 young collections: each of its walks costs 0.2 s).
    What is garbage here is almost all freed by reference counting; cycles among young
    objects are still collected as often, older ones later."""
    import gc

    gc.set_threshold(50_000, 1000, 100)


def _interrupted() -> None:
    """Ctrl-C: end every process the build started and exit 130 at once, without
    waiting for the threads still running actions."""
    from .execution.sandbox import kill_children

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
