"""qbuild's generic built-in rules: ``filegroup`` (source files as a target) and
``command`` (run a command over declared inputs, keep declared outputs; like Bazel's
genrule). Registered through the ``qbuild`` entry-point group like any plugin; rule API
v2 (each declares one action at analysis; dependents get ``DefaultInfo``)."""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Mapping
from typing import Any

from qbuild import (
    AnalysisContext,
    ConfigError,
    Rule,
    RunContext,
    attr,
    fact_generation,
    forward_files,
    hookimpl,
    output_folder,
)

_PLACEHOLDER = re.compile(r"\$\((SRCS|OUTS|OUT|location\s+([^)\s]+))\)")


class FileGroup(Rule):
    """Source files (globs allowed), gathered as one target."""

    kind = "filegroup"
    version = 1
    doc = ("A named set of source files relative to the package (globs allowed). "
           "Dependents see them as this target's outputs, under their file names.")
    attrs = {
        "srcs": attr.files(doc="Source files or globs relative to the package.",
                           required=True),
    }

    def validate(self, attrs: Mapping[str, Any]) -> None:
        for item in attrs["srcs"]:
            if item.startswith("//"):
                raise ConfigError(f"filegroup takes source files, not targets ({item})",
                                  attr="srcs")

    def declared_outputs(self, name: str, attrs: Mapping[str, Any]) -> list[str]:
        return [path.rsplit("/", 1)[-1] for path in attrs["srcs"]]

    def analyze(self, ctx: AnalysisContext) -> None:
        # Each source under its file name; qbuild runs this without a sandbox.
        ctx.action(forward_files, inputs=["srcs"], outputs=ctx.outputs,
                   mnemonic="FileGroup")


class Command(Rule):
    """Run a shell command in a scratch directory holding only its declared inputs."""

    kind = "command"
    version = 1
    doc = ("Run a command (through /bin/sh) in a sandbox holding only the declared `srcs` "
           "(at their workspace-relative paths; other targets' outputs under "
           "qbuild-out/<pkg>/<name>/) and keep only the declared `outs`. In `cmd`, "
           "$(SRCS) expands to the inputs, $(OUTS) to the outputs, $(OUT) to the single "
           "output, and $(location LABEL) to a dependency's file(s). The environment holds "
           "only PATH, LANG, HOME and TMPDIR (both a private scratch folder) and the "
           "variables named in `env` and `pass_env`. PATH, LANG, /bin/sh and the content of "
           "every program `cmd` may name (every word of it, in quotes, backticks and $(...) "
           "too, that is a program on PATH or an absolute path) and of every program in "
           "`tools` are part of the key.")
    attrs = {
        "cmd": attr.string(doc="The shell command.", required=True),
        "srcs": attr.files(doc="Input files, globs or labels."),
        "outs": attr.string_list(doc="Output file names (relative to the target's output "
                                     "folder); a name ending in / is a directory.",
                                 required=True),
        "env": attr.mapping(doc="Extra environment variables (name = value); part of the key."),
        "pass_env": attr.string_list(doc="Names of variables passed through from the caller's "
                                         "environment (their values are NOT part of the key)."),
        "tools": attr.string_list(doc="Programs the command runs without `cmd` naming them "
                                      "(started by a script among `srcs`, say): names looked "
                                      "up on PATH, or absolute paths; their content is part "
                                      "of the key (a missing one is keyed as absent)."),
    }

    def declared_outputs(self, name: str, attrs: Mapping[str, Any]) -> list[str]:
        return list(attrs["outs"])

    def validate(self, attrs: Mapping[str, Any]) -> None:
        if not attrs["outs"]:
            raise ConfigError("a command needs at least one output", attr="outs")
        for key, value in attrs["env"].items():
            if not isinstance(value, (str, int, float, bool)):
                raise ConfigError(f"env value for {key} must be a string", attr="env")
        if len(attrs["outs"]) != 1 and "$(OUT)" in attrs["cmd"]:
            raise ConfigError(f"$(OUT) needs exactly one output, but outs has "
                              f"{len(attrs['outs'])}; use $(OUTS)", attr="cmd")

    def target_env(self, attrs: Mapping[str, Any]) -> dict[str, str]:
        path = os.environ.get("PATH", os.defpath)
        found, shell = _words_found(path)
        facts = {"PATH": path, "LANG": os.environ.get("LANG", ""), "program /bin/sh": shell}
        declared = set(attrs["tools"])
        for word in sorted(_program_words(attrs["cmd"]) | declared):
            digest = found.get(word, _UNSEEN)
            if digest is _UNSEEN:
                program = word if word.startswith("/") else _which(word, found[_STATE])
                digest = found[word] = _program(program) if program else None
            if digest:
                facts[f"program {word}"] = digest
            elif word in declared:
                facts[f"program {word}"] = "absent"
        return facts

    def analyze(self, ctx: AnalysisContext) -> None:
        package = ctx.label[2:].rsplit(":", 1)[0]
        srcs = ctx.attrs["srcs"]
        dep_dirs = {item: f"qbuild-out/{output_folder(item)}"
                    for item in srcs if item.startswith("//")}
        # The command sees the workspace layout (sources at their paths, dependencies'
        # outputs under qbuild-out/<pkg>/@<name>/): the engine stages the inputs there
        # once (the layout), and it is declared, as params, so it is part of the
        # action's key like everything else it reads. Dependencies' outputs may be hard
        # links to the cache (no copy on filesystems without reflinks): a command that
        # writes to one fails and the cache drops that blob.
        ctx.action(run_command, inputs=["srcs"], outputs=ctx.outputs, mnemonic="Command",
                   link_inputs=True,
                   params={"cmd": ctx.attrs["cmd"], "outs": ctx.outputs,
                           "srcs": srcs, "package": package,
                           "out_dir": f"qbuild-out/{output_folder(ctx.label)}",
                           "dep_dirs": dep_dirs,
                           "env": ctx.attrs["env"], "pass_env": ctx.attrs["pass_env"]},
                   layout={"srcs": [dep_dirs.get(item, item) for item in srcs]})


def run_command(ctx: RunContext) -> None:
    """Run ``cmd`` through /bin/sh in the workspace-shaped folder its inputs were
    staged in (the action of ``command``)."""
    params = ctx.params
    root = ctx.root
    root.mkdir(exist_ok=True)
    srcs: list[str] = []
    for index, rel in ctx.origins["srcs"]:
        item = params["srcs"][index]
        srcs.append(f"{params['dep_dirs'][item]}/{rel}" if item.startswith("//") else item)
    out_dir = params["out_dir"]
    outs = [f"{out_dir}/{name}" for name in params["outs"]]
    for name in params["outs"]:
        target = root / out_dir / name.rstrip("/")
        if name.endswith("/"):
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)

    def expand(match: re.Match[str]) -> str:
        what = match.group(1)
        if what == "SRCS":
            return " ".join(shlex.quote(s) for s in srcs)
        if what == "OUTS":
            return " ".join(shlex.quote(o) for o in outs)
        if what == "OUT":
            if len(outs) != 1:
                raise ctx.fail("$(OUT) needs exactly one output; use $(OUTS)", attr="cmd")
            return shlex.quote(outs[0])
        target = match.group(2)
        found = [s for s in srcs if _matches(s, target, params["package"])]
        if not found:
            raise ctx.fail(f"$(location {target}): not among srcs", attr="cmd")
        return " ".join(shlex.quote(s) for s in found)

    command = _PLACEHOLDER.sub(expand, params["cmd"])
    home = ctx.scratch / "home"
    home.mkdir()
    # HOME and TMPDIR are private: what a tool reads or leaves there cannot leak
    # between actions or escape the key.
    env = {name: os.environ[name] for name in ("PATH", "LANG") if name in os.environ}
    env.update({"HOME": str(home), "TMPDIR": str(home)})
    env.update({name: os.environ[name] for name in params["pass_env"] if name in os.environ})
    env.update({k: str(v) for k, v in params["env"].items()})
    ctx.log(f"$ {command}")
    with open(ctx.log_path, "a", encoding="utf-8") as log:
        log.flush()
        proc = subprocess.run(command, shell=True, cwd=root, env=env, stdout=log,
                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                              start_new_session=True)
    if proc.returncode != 0:
        raise ctx.fail(f"command exited with status {proc.returncode}", attr="cmd")
    for name in params["outs"]:
        made = root / out_dir / name.rstrip("/")
        if name.endswith("/") and made.is_dir() and not made.is_symlink():
            shutil.rmtree(ctx.output(name))
            os.rename(made, ctx.output(name))
        elif not name.endswith("/") and made.is_file() and not made.is_symlink():
            os.rename(made, ctx.output(name))
        # else: left unwritten; the engine names the missing output


def _matches(src: str, target: str, package: str) -> bool:
    if target.startswith(":"):
        target = f"//{package}{target}"
    if target.startswith("//"):
        if ":" not in target:
            target = f"{target}:{target.rstrip('/').rsplit('/', 1)[-1]}"
        return src.startswith(f"qbuild-out/{output_folder(target)}/")
    return src == (f"{package}/{target}" if package else target)


# A tool added to or removed from a PATH folder changes the folder's stat; one replaced
# in place changes its own. Both are stat'ed once per fact generation (one build, or one
# request a remote worker checks), not once per target: a tool replaced while a build
# keys its targets may be keyed late, the same race as replacing it between keying an
# action and running it.
_states: dict[str, tuple[int, int]] = {}  # PATH -> (generation, state id)
_state_ids: dict[tuple[str, Any], int] = {}
_programs: dict[str, tuple[tuple[int, ...] | None, str | None, int]] = {}


# Every PATH folder listed and program file stat'ed for a key in this process: the
# paths that skip keying vouch for the keys by their stats (``qbuild_key_files``).
_key_files: set[str] = set()


@hookimpl
def qbuild_key_files() -> list[str]:
    return sorted(_key_files)


_UNSEEN = object()
_STATE = "\0state"  # (no word holds a NUL)
# (PATH, generation) -> ({word: program digest or None, _STATE: PATH state id}, /bin/sh)
_words_memo: dict[tuple[str, int], tuple[dict[str, Any], str]] = {}


def _words_found(path: str) -> tuple[dict[str, Any], str]:
    """The digest each word names as a program under ``path`` (filled in as words are
    met) and /bin/sh's digest, for this generation: every target of a build shares them,
    as ``_path_state`` and ``_program`` would give them again within the generation."""
    memo_key = (path, fact_generation())
    known = _words_memo.get(memo_key)
    if known is None:
        for old in [k for k in _words_memo if k[1] != fact_generation()]:
            del _words_memo[old]
        shell = _program("/bin/sh") or _program_digest("/bin/sh")
        known = _words_memo[memo_key] = ({_STATE: _path_state(path)}, shell)
    return known


def _path_state(path: str) -> int:
    """An id for PATH and the stats of its folders."""
    known = _states.get(path)
    if known is not None and known[0] == fact_generation():
        return known[1]
    folders = [d for d in path.split(os.pathsep) if d]
    _key_files.update(os.path.abspath(d) for d in folders)
    state = (path, tuple(_stat(d) for d in folders))
    state_id = _state_ids.setdefault(state, len(_state_ids))
    _states[path] = (fact_generation(), state_id)
    _paths[state_id] = path
    return state_id


def _program(path: str) -> str | None:
    """The digest of the executable file at ``path`` (None if it is not one), memoised
    while its stat stays the same."""
    generation = fact_generation()
    known = _programs.get(path)
    if known is not None and known[2] == generation:
        return known[1]
    st = _stat(path)
    _key_files.add(os.path.abspath(path))
    if known is not None and known[0] == st:
        _programs[path] = (st, known[1], generation)
        return known[1]
    digest = None
    if st is not None and os.path.isfile(path) and os.access(path, os.X_OK):
        digest = _program_digest(path)
    _programs[path] = (st, digest, generation)
    return digest


_found: dict[tuple[str, int], str | None] = {}
_paths: dict[int, str] = {}
_listings: dict[int, list[tuple[str, frozenset[str] | None]]] = {}


def _which(word: str, state: int) -> str | None:
    """``shutil.which`` memoised while PATH and its folders' stats stay the same
    (``state`` from ``_path_state``); each PATH folder is listed once for that state, so
    a word that names no program (an argument) costs no stat calls."""
    key = (word, state)
    if key not in _found:
        listing = _listings.get(state)
        if listing is None:
            listing = []
            for folder in dict.fromkeys(_paths[state].split(os.pathsep)):
                try:
                    names: frozenset[str] | None = frozenset(os.listdir(folder))
                except OSError:
                    names = None  # not listable: look for the file itself, as which does
                listing.append((folder, names))
            _listings[state] = listing
        found = None
        for folder, names in listing:
            if names is not None and word not in names:
                continue
            candidate = os.path.join(folder, word)
            if os.path.exists(candidate) and not os.path.isdir(candidate) and \
                    os.access(candidate, os.X_OK):
                found = candidate
                break
        _found[key] = found
    return _found[key]


def _stat(path: str) -> tuple[int, ...] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


_WORD = re.compile(r"^(/[^\s]+|[A-Za-z0-9_][A-Za-z0-9_.+-]*)$")
_digests: dict[tuple[str, int, int, int], str] = {}
# Everything the shell treats specially ends a word: quotes, backticks, $( and ${,
# redirections, separators, globs, assignments. So a program inside any quoting or
# substitution, at any depth, is still a word of its own.
_TOKEN = re.compile(r"[^\s;&|<>()`'\"$\\{}=#!*?\[\]~,:]+")


def _program_words(cmd: str) -> set[str]:
    """Every word of ``cmd`` that could name a program, found without parsing the shell:
    over-including is harmless (a word that is not a program on PATH adds nothing to the
    key), missing one would serve an output made by another version of it."""
    return {w for w in _TOKEN.findall(cmd) if _WORD.match(w)}


def _program_digest(path: str) -> str:
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except OSError:
        return "absent"
    memo_key = (real, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    digest = _digests.get(memo_key)
    if digest is None:
        sha = hashlib.sha256()
        with open(real, "rb") as handle:
            while chunk := handle.read(1 << 20):
                sha.update(chunk)
        digest = _digests[memo_key] = sha.hexdigest()
    return digest


@hookimpl
def qbuild_rule_types() -> list[type[Rule]]:
    return [FileGroup, Command]
