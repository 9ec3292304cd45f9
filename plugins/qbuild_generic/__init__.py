"""qbuild's generic built-in rules: ``filegroup`` (source files as a target) and
``command`` (run a command over declared inputs, keep declared outputs; like Bazel's
genrule). Registered through the ``qbuild`` entry-point group like any plugin."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from typing import Any

from qbuild import ActionContext, ConfigError, Rule, attr, hookimpl

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

    def validate(self, attrs: Any) -> None:
        for item in attrs["srcs"]:
            if item.startswith("//"):
                raise ConfigError(f"filegroup takes source files, not targets ({item})",
                                  attr="srcs")

    def declared_outputs(self, name: str, attrs: Any) -> list[str]:
        return [path.rsplit("/", 1)[-1] for path in attrs["srcs"]]

    def run(self, ctx: ActionContext) -> dict[str, Any]:
        names = [path.name for path in ctx.attrs["srcs"]]
        for name, path in zip(names, ctx.attrs["srcs"]):
            with open(path, "rb") as src, open(ctx.output(name), "wb") as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
        return {"files": names}


class Command(Rule):
    """Run a shell command in a scratch directory holding only its declared inputs."""

    kind = "command"
    version = 1
    doc = ("Run a command (through /bin/sh) in a sandbox holding only the declared `srcs` "
           "(at their workspace-relative paths; other targets' outputs under "
           "qbuild-out/<pkg>/<name>/) and keep only the declared `outs`. In `cmd`, "
           "$(SRCS) expands to the inputs, $(OUTS) to the outputs, $(OUT) to the single "
           "output, and $(location LABEL) to a dependency's file(s). The environment holds "
           "only PATH, HOME, LANG and the variables named in `env`.")
    attrs = {
        "cmd": attr.string(doc="The shell command.", required=True),
        "srcs": attr.files(doc="Input files, globs or labels."),
        "outs": attr.string_list(doc="Output file names (relative to the target's output "
                                     "folder); a name ending in / is a directory.",
                                 required=True),
        "env": attr.mapping(doc="Extra environment variables (name = value); part of the key."),
        "pass_env": attr.string_list(doc="Names of variables passed through from the caller's "
                                         "environment (their values are NOT part of the key)."),
    }

    def declared_outputs(self, name: str, attrs: Any) -> list[str]:
        return list(attrs["outs"])

    def validate(self, attrs: Any) -> None:
        if not attrs["outs"]:
            raise ConfigError("a command needs at least one output", attr="outs")
        for key, value in attrs["env"].items():
            if not isinstance(value, (str, int, float, bool)):
                raise ConfigError(f"env value for {key} must be a string", attr="env")
        if len(attrs["outs"]) != 1 and "$(OUT)" in attrs["cmd"]:
            raise ConfigError(f"$(OUT) needs exactly one output, but outs has "
                              f"{len(attrs['outs'])}; use $(OUTS)", attr="cmd")

    def run(self, ctx: ActionContext) -> dict[str, Any]:
        root = ctx.workdir
        srcs = [p.relative_to(root).as_posix() for p in ctx.attrs["srcs"]]
        outs = [ctx.output(name).relative_to(root).as_posix() for name in ctx.attrs["outs"]]

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
            found = [s for s in srcs if _matches(s, target, ctx.package)]
            if not found:
                raise ctx.fail(f"$(location {target}): not among srcs", attr="cmd")
            return " ".join(shlex.quote(s) for s in found)

        command = _PLACEHOLDER.sub(expand, ctx.attrs["cmd"])
        env = {name: os.environ[name] for name in ("PATH", "HOME", "LANG", "TMPDIR")
               if name in os.environ}
        env.update({name: os.environ[name] for name in ctx.attrs["pass_env"]
                    if name in os.environ})
        env.update({k: str(v) for k, v in ctx.attrs["env"].items()})
        ctx.log(f"$ {command}")
        with open(ctx.log_path, "a", encoding="utf-8") as log:
            log.flush()
            proc = subprocess.run(command, shell=True, cwd=root, env=env, stdout=log,
                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  start_new_session=True)
        if proc.returncode != 0:
            raise ctx.fail(f"command exited with status {proc.returncode}", attr="cmd")
        return {"outs": list(ctx.attrs["outs"])}


def _matches(src: str, target: str, package: str) -> bool:
    if target.startswith(":"):
        target = f"//{package}{target}"
    if target.startswith("//"):
        pkg, _, name = target[2:].partition(":")
        prefix = f"qbuild-out/{pkg}/{name}/" if pkg else f"qbuild-out/{name}/"
        return src.startswith(prefix)
    return src == (f"{package}/{target}" if package else target)


@hookimpl
def qbuild_rule_types() -> list[type[Rule]]:
    return [FileGroup, Command]
