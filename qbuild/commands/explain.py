"""``qbuild explain LABEL``: what changed since the target was last built, without
building anything. Dependencies that would rebuild are explained first, since their new
outputs are what would change the target's inputs."""

from __future__ import annotations

from ..build.session import Session
from ..build.state import WorkspaceState
from ..core.labels import Label
from ..core.records import ActionResult
from ..keys.parts import diff


def explain(session: Session, label: Label) -> list[str]:
    graph = session.graph
    order = graph.analyze([label])
    state = WorkspaceState(session.workspace.output_dir)
    store = session.store
    results: dict[Label, ActionResult] = {}
    lines: list[str] = []
    for item in order:
        target = graph.targets[item]
        if target.is_group:
            continue
        stale = [dep for dep in target.deps if dep not in results
                 and not graph.targets[dep].is_group]
        if stale:
            if item == label:
                lines.append(f"{item} would rebuild after its dependencies "
                             f"{', '.join(str(d) for d in stale)} rebuild")
            continue
        parts, key, _ = session.keyer.key_for(target, results)
        last = state.last_keys.get(str(item))
        cached, origin = store.find_action(key, record=False)
        if cached is not None:
            results[item] = cached
        if item != label and cached is not None:
            continue
        old = store.get_components(last) if last else None
        changes = diff(old, parts, session.keyer.code_files) if last != key else []
        if item != label:
            lines.append(f"{item} would rebuild: " + "; ".join(changes or ["not in the cache"]))
            continue
        if last == key and cached is not None and origin == "local":
            came = ("came from the remote cache" if cached.origin == "remote"
                    else "was built on this machine")
            lines.append(f"{item} is up to date (action key {key[:16]}; its result {came})")
        elif cached is not None and origin == "remote":
            lines.append(f"{item} would be served from the remote cache (built elsewhere "
                         "with exactly these inputs); since its last build here:")
            lines += [f"  {line}" for line in (changes or ["never built here"])]
        elif cached is not None:
            lines.append(f"{item} would be served from the local cache (built before with exactly "
                         "these inputs); since its last build here:")
            lines += [f"  {line}" for line in changes]
        else:
            lines.append(f"{item} would rebuild:")
            lines += [f"  {line}" for line in (changes or ["its cached result was removed"])]
    return lines
