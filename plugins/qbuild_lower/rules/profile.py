"""The rule ``profile``: models timed interleaved in one process on a target runtime
(onnxruntime or OpenVINO), the runtime's per-op profiles and multiply-accumulate counts
side by side (``profiling``)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from qbuild_onnx_common.providers import DatasetInfo, OnnxModelInfo
from qbuild_onnx_common.rule import OnnxRule
from qbuild_onnx_common.runtimes import check_runtime, key_facts, runtime_attr

from qbuild import AnalysisContext, ConfigError, RunContext, attr

from .inputs import action_feeds, model_file


class Profile(OnnxRule):
    kind = "profile"
    machine_dependent = True  # measures this machine's kernels
    reproducible = False  # timings
    version = 3
    doc = (
        "Where the time goes: every model timed interleaved with the others in one process "
        "on the `runtime` (warm-ups, `threads` intra-op threads, median, quartiles, spread; "
        "noisy runs and models slower than the reference are flagged), and the runtime's "
        "profiler per model (its runs interleaved too): time per op type and the top "
        "nodes, side by side in report.md, with each model's multiply-accumulate count. "
        "Timings make the report not reproducible."
    )
    heavy = True
    attrs = {
        "models": attr.label_list(doc="Model targets (one .onnx output each).", required=True,
                                  providers=[OnnxModelInfo]),
        "reference": attr.label(doc="The float model the others are compared with "
                                    "(default: the first of models).",
                                providers=[OnnxModelInfo]),
        "dataset": attr.label(doc="qbuild dataset (first sample is timed); without it, "
                                  "seeded random inputs.", providers=[DatasetInfo]),
        "threads": attr.int(default=1, doc="onnxruntime intra-op threads."),
        "runs": attr.int(default=30, doc="Timed interleaved rounds."),
        "warmup": attr.int(default=5, doc="Untimed rounds first."),
        "profile_runs": attr.int(default=10, doc="Runs under onnxruntime's profiler "
                                                 "(0: no per-op profile)."),
        "top": attr.int(default=15, doc="Top nodes listed per model."),
        "runtime": runtime_attr("times and profiles the models (the reference in every "
                                "float form it offers: fp32, and OpenVINO's bf16 where it "
                                "picks it; speed-ups are against the fastest)"),
    }
    outputs = ["report.json", "report.md"]

    def target_env(self, attrs: Mapping[str, Any]) -> dict[str, str]:
        return key_facts(attrs["runtime"])

    def validate(self, attrs: Mapping[str, Any]) -> None:
        check_runtime(attrs)
        for name in ("threads", "runs"):
            if attrs[name] < 1:
                raise ConfigError("threads and runs must be >= 1", attr=name)

    def analyze(self, ctx: AnalysisContext) -> None:
        a = ctx.attrs
        # Models are named by label in the report: the labels are declared params.
        ctx.action(profile, inputs=["models", "reference", "dataset"], outputs=ctx.outputs,
                   mnemonic="Profile",
                   params={"models": a["models"], "reference": a["reference"],
                           **{k: a[k] for k in ("threads", "runs", "warmup",
                                                "profile_runs", "top", "runtime")}})


def profile(ctx: RunContext) -> None:
    """The action of ``profile``: interleaved latency and per-op profiles."""
    from qbuild_onnx_common.errors import OnnxError
    from qbuild_onnx_common.latency import slower_verdict
    from qbuild_onnx_common.models import load_model

    from ..profiling.macs import macs
    from ..profiling.report import ModelProfile, ProfileReport, render
    from ..profiling.timing import conditions, interleaved_latency, op_profiles

    p = ctx.params
    deps = dict(zip(p["models"], ctx.inputs["models"]))
    if p["reference"] is not None and p["reference"] not in deps:
        deps = {p["reference"]: ctx.inputs["reference"], **deps}
    ref_label = p["reference"] if p["reference"] is not None else next(iter(deps))
    paths = {label: model_file(ctx, dep, label, "models") for label, dep in deps.items()}
    first = load_model(paths[ref_label])
    feeds, inputs = action_feeds(ctx, first, count=1)
    before = conditions()
    try:
        lat = interleaved_latency(paths, feeds[0], p["threads"], p["runs"], p["warmup"],
                                  reference=ref_label, runtime=p["runtime"])
        profs = (op_profiles(paths, feeds[0], p["threads"], p["profile_runs"], p["warmup"],
                             p["top"], p["runtime"]) if p["profile_runs"] > 0 else {})
    except OnnxError as e:
        raise ctx.fail(e.message, attr=e.attr or "models") from None
    models: dict[str, ModelProfile] = {}
    for label, path in paths.items():
        entry: ModelProfile = {"macs": macs(load_model(path))}
        if label in profs:
            entry["profile"] = profs[label]
        models[label] = entry
    report: ProfileReport = {"reference": ref_label, "inputs": inputs, "latency": lat,
                             "models": models,
                             "conditions": {"before": before, "after": conditions()}}
    ctx.output("report.json").write_text(json.dumps(report, indent=1, sort_keys=True))
    ctx.output("report.md").write_text(render(report))
    for label, m in lat["models"].items():
        if m.get("slower_than_reference"):
            v = slower_verdict(m, lat["models"][lat.get("baseline", ref_label)])
            ctx.warn(f"{label} is slower than {ref_label}: {v['ms']} vs {v['reference_ms']} "
                     f"ms {'CPU' if v['basis'] == 'cpu' else 'wall'} time, median "
                     f"({p['threads']} thread(s))")
    if lat["noisy"]:
        ctx.warn("noisy measurement: an interquartile range exceeds 10 % of its median")
