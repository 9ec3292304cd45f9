"""report.md of the ``profile`` rule: the latency table, the time per op type side by side
and each model's most expensive nodes."""

from __future__ import annotations

from typing import TypedDict

from .timing import Conditions, Latency, OpProfile


class _ModelCore(TypedDict):
    macs: dict[str, int]


class ModelProfile(_ModelCore, total=False):
    """One model in the profile report: its MACs and, when profiled, its op profile."""

    profile: OpProfile


class ProfileReport(TypedDict):
    """report.json of the ``profile`` rule."""

    reference: str
    inputs: str
    latency: Latency
    models: dict[str, ModelProfile]
    conditions: dict[str, Conditions]  # "before" and "after" the measurements


def _macs(m: dict[str, int]) -> str:
    return (f">= {m['total']:,} ({m['unresolved_nodes']} nodes without shapes)"
            if m.get("unresolved_nodes") else f"{m['total']:,}")


def render(report: ProfileReport) -> str:
    """report.md of the ``profile`` rule: latency table, then op types side by side."""
    lat = report["latency"]
    labels = list(report["models"])
    runtime = lat.get("runtime", "onnxruntime")
    lines = [f"# Profile on {runtime} ({lat['threads']} thread(s), {lat['runs']} "
             f"interleaved rounds after {lat['warmup']} warm-ups)", ""]
    c = report["conditions"].get("before")
    other = f", {runtime} {lat.get('runtime_version')}" if runtime != "onnxruntime" else ""
    if c:
        lines += [f"Machine: {c.get('cpus')} CPUs {c.get('machine')}, Python {c.get('python')}, "
                  f"onnxruntime {c.get('onnxruntime')}{other}; load average before "
                  f"{c.get('load_average_1_5_15min')}, after "
                  f"{report['conditions']['after'].get('load_average_1_5_15min')}.", ""]
    lines += ["| model | median ms | q1-q3 ms | spread | speed-up vs reference | CPU ms "
              "(spread) | CPU speed-up | MACs |", "|---|---|---|---|---|---|---|---|"]
    for lab in lat["models"]:  # the models, and the reference's other float forms
        m = lat["models"][lab]
        macs = report["models"][lab]["macs"] if lab in report["models"] else None
        flag = " (noisy)" if m["noisy"] else ""
        # the verdict is marked in the column it was decided on (CPU time with one thread)
        cs = m.get("cpu")
        slow = (" **slower than the reference**" if m.get("slower_than_reference")
                and not cs else "")
        cpu = (f"{cs['median_ms']:.3f} ({cs['spread']:.1%}) | {cs.get('speedup', 1.0)}x"
               f"{' **slower than the reference**' if cs.get('slower_than_reference') else ''}"
               if cs else " | ")
        lines.append(f"| {lab} | {m['median_ms']:.3f} | {m['q1_ms']:.3f}-{m['q3_ms']:.3f} | "
                     f"{m['spread']:.1%}{flag} | {m.get('speedup', 1.0)}x{slow} | {cpu} | "
                     f"{_macs(macs) if macs else 'as ' + report['reference']} |")
    if lat.get("baseline") and lat["baseline"] != report["reference"]:
        lines += ["", f"Speed-ups are against {lat['baseline']}: the fastest float form of "
                  f"the reference {runtime} offers on this CPU."]
    if any("cpu" in m for m in lat["models"].values()):
        lines += ["", "CPU ms: the run's CPU time on its one thread (what the model costs, "
                  "without the time spent waiting for a core: steady on a loaded machine). "
                  "Whether a model is slower than the reference is decided on it."]
    profs = {lab: report["models"][lab].get("profile") for lab in labels}
    if any(profs.values()):
        types: list[str] = []
        for p in profs.values():
            for op in (p["op_types"] if p else {}):
                if op not in types:
                    types.append(op)
        lines += ["", "## Time per op type (ms per run: median of the profiled runs / sum of "
                  "each node's fastest run; nodes)", "",
                  "| op type | " + " | ".join(labels) + " |",
                  "|---|" + "---|" * len(labels)]
        for op in types:
            cells = []
            for lab in labels:
                prof = profs[lab]
                t = prof["op_types"].get(op) if prof else None
                cells.append(f"{t['ms']:.3f} / {t.get('min_ms', t['ms']):.3f} ({t['nodes']})"
                             if t else "")
            lines.append(f"| {op} | " + " | ".join(cells) + " |")
        lines.append("| all kernels | " + " | ".join(
            f"{p['kernel_ms']:.3f} / {p.get('kernel_min_ms', p['kernel_ms']):.3f}" if p else ""
            for p in profs.values()) + " |")
        for lab in labels:
            p = profs[lab]
            if not p:
                continue
            lines += ["", f"### Top nodes: {lab}", "", "| node | op type | ms |", "|---|---|---|"]
            lines += [f"| {n['node']} | {n['op_type']} | {n['ms']:.3f} |" for n in p["top_nodes"]]
    return "\n".join(lines) + "\n"
