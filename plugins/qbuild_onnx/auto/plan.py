"""The trial plan of ``auto_quantize``: which ordinary targets the macro expands to.

For ``[aq] rule = "auto_quantize"`` the package gains, in this order (cheapest ideas
first), every one an ordinary cached target:

* ``aq.calibration_data``: ``disjoint_dataset``, the calibration data passed on only when
  it shares no image (or sample) with the evaluation data; every target below that reads
  calibration data reads this one, so an overlapping selection set is refused in one
  line before anything calibrates;
* ``aq.calib_<method>``: ``calibrate`` of the model on the calibration data, one per
  method, shared by every trial that uses the method;
* trials (``quantize`` unless noted), each with an ``evaluate`` target ``aq.ev_<trial>``
  on the evaluation data with the task and latency measurement:
  ``u8`` (uint8 activations, per-channel weights, first calibration method), ``i8``
  (int8 activations), ``u8_per_tensor``, ``u8_<method>`` (other calibration methods),
  with step ``symmetric`` ``sym`` (``preset`` symmetric), with step ``nncf`` ``nncf`` /
  ``nncf_bc`` (``aq.calib_mean_minmax``, ``preset`` mixed, ``placement`` conv_inputs,
  then ``bias_correction`` method fast: NNCF's recipe, for runtimes that fuse Q/DQ at
  convolution inputs such as OpenVINO; both steps only when named in ``steps``; with
  step ``region`` too, ``nncf_region`` / ``nncf_region_bc``: the same with ``region``'s
  stem or head float),
  ``cle`` (``equalize`` (cross-layer equalization, Clip -> Relu) of the model as
  ``aq.cle_model``, calibrated as ``aq.calib_cle``, then quantized like ``u8``),
  ``u8_bc`` (``bias_correction`` of ``u8``), ``u8_ar`` / ``cle_ar`` (``adaround`` of
  ``u8`` / ``cle``, options from ``adaround_options``), ``region`` / ``region_bc`` (the
  stem or head
  around the most sensitive activation kept float, from ``aq.sens`` (task-aware
  ``sensitivity`` of ``u8``) and ``aq.region_overrides`` (``sensitive_region``)),
  ``region3`` / ``region3_bc`` (the union of the three most sensitive ones' regions;
  ``aq.sens`` is a ``sensitivity_merge`` of ``aq.sens_s<i>``, the ranking in
  ``sensitivity_shards`` actions, default 2, so that every core ranks),
  ``pct_region_k<k>`` / ``pct_region_k<k>_bc`` (percentile ranges, ``aq.calib_percentile``
  at ``percentile``, default 99.99, with the union of the regions of the k most sensitive
  activations float, ``aq.region_k<k>_overrides``; k from ``region_counts``),
  ``float_k<k>``
  (the k most sensitive activations float), ``u16_k<k>`` (16-bit), ``region_u16_k<k>`` /
  ``region_u16_k<k>_bc`` (the stem or head region float and the next k ranked activations
  at uint16); with step ``lower``, ``region_bc_int`` and ``region_u16_k<k>_bc_int``: the
  same models lowered to onnxruntime's integer operators (``lower_integer`` mode ort,
  bit-exact with their QDQ source, so only their latency differs; a source that kept
  every node float is copied, not lowered).

With ``runtime = "openvino"`` every trial is evaluated and timed on OpenVINO, every
``quantize`` trial places Q/DQ at convolution inputs only (the runtime's placement preset,
``qbuild_onnx_common.runtimes.presets``), and step ``lower`` is left out (its integer
operators are onnxruntime's).

A trial may fail (or quantize nothing) without failing the search: the ``aq`` target
tolerates its candidates', reports' and sensitivity's failures (``tolerate_failures``),
reports each failed trial with its one-line reason and excludes it; it fails only when
every trial failed. A failure is never cached, so the next build tries the trial again.

The ``aq`` target itself only selects, so changing the bar or the objective reruns the
selection alone; adding a top-k value or a step adds only its own targets.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from qbuild_onnx_common.runtimes import NAMES, ONNXRUNTIME
from qbuild_onnx_common.runtimes.presets import CONV_INPUTS, PLACEMENT

from qbuild import ConfigError

STEPS = ("activation_type", "per_channel", "calibration", "symmetric", "nncf", "cle",
         "bias_correction", "adaround", "region", "percentile_region", "float_top_k",
         "uint16_top_k", "region_uint16", "lower")
#: Families only run when ``steps`` names them: adaround costs minutes; symmetric and nncf
#: aim at runtimes other than onnxruntime (nncf's conv_inputs placement runs slower than
#: float there, so the default onnxruntime search would only time it to drop it).
OPT_IN_STEPS = ("symmetric", "nncf", "adaround")
NNCF_METHOD = "mean_minmax"
_GENERATED = ("candidates", "reports", "trial_names", "sensitivity", "checked_data")


def _list(raw: dict[str, Any], key: str, default: list[Any], kind: type) -> list[Any]:
    value = raw.get(key, default)
    if not isinstance(value, list) or not all(isinstance(v, kind) and not isinstance(v, bool)
                                              for v in value):
        raise ConfigError(f"must be a list of {kind.__name__}", attr=key)
    return value


@dataclass
class _Plan:
    """The target tables and trial names of one ``auto_quantize`` target, added step by
    step (in this order: the trials' order is the candidates' order)."""

    name: str
    raw: dict[str, Any]
    methods: list[str]  # calibration methods, the first one the default
    placement: dict[str, Any] = field(default_factory=dict)  # quantize attrs of the preset
    tables: dict[str, dict[str, Any]] = field(default_factory=dict)
    trials: list[str] = field(default_factory=list)

    @property
    def me(self) -> str:
        """The label prefix of the generated targets (same package)."""
        return f":{self.name}"

    @property
    def model(self) -> str:
        return str(self.raw["model"])

    @property
    def data(self) -> str:
        """The calibration data as every trial reads it: through the check that it
        shares nothing with the evaluation data (``<name>.calibration_data``)."""
        return f"{self.me}.calibration_data"

    def add(self, suffix: str, table: dict[str, Any]) -> None:
        self.tables[f"{self.name}.{suffix}"] = table

    def quantize(self, trial: str, **attrs: Any) -> None:
        self.add(trial, {"rule": "quantize", "model": self.model,
                         "calibration": f"{self.me}.calib_{self.methods[0]}",
                         **self.placement, **attrs})
        self.trials.append(trial)

    def bias_corrected(self, trial: str, **attrs: Any) -> None:
        """The trial ``<trial>_bc``: ``trial``'s model with its biases corrected."""
        self.add(f"{trial}_bc", {"rule": "bias_correction", "model": f"{self.me}.{trial}",
                                 "reference": self.model,
                                 "dataset": self.data, **attrs})
        self.trials.append(f"{trial}_bc")


def runtime_of(raw: dict[str, Any]) -> str:
    """The search's runtime, checked."""
    runtime = raw.get("runtime", ONNXRUNTIME)
    if runtime not in NAMES:
        raise ConfigError(f"unknown runtime {runtime!r} (known: {', '.join(NAMES)})",
                          attr="runtime")
    return str(runtime)


def placement_attrs(runtime: str) -> dict[str, Any]:
    """The quantize attributes of ``runtime``'s placement preset: none for onnxruntime's
    own (quantize's default), ``placement = "conv_inputs"`` for convolution inputs
    only."""
    placement = PLACEMENT[runtime]
    return {"placement": placement} if placement == CONV_INPUTS else {}


def _checked(raw: dict[str, Any]) -> tuple[list[str], list[str], list[int], list[int]]:
    """The macro's attributes checked: (calibration methods, steps, top_k, region
    counts)."""
    for key in _GENERATED:
        if key in raw:
            raise ConfigError("is filled in by auto_quantize itself; do not set it", attr=key)
    for key in ("model", "calibration_data", "evaluation_data"):
        if not isinstance(raw.get(key), str):
            raise ConfigError("missing required attribute (label)", attr=key)
    methods = _list(raw, "calibration_methods", ["minmax", "percentile"], str)
    if not methods:
        raise ConfigError("needs at least one method", attr="calibration_methods")
    steps = _list(raw, "steps", [s for s in STEPS if s not in OPT_IN_STEPS], str)
    bad = [s for s in steps if s not in STEPS]
    if bad:
        raise ConfigError(f"unknown step '{bad[0]}' (known: {', '.join(STEPS)})", attr="steps")
    top_k = _list(raw, "top_k", [2, 8], int)
    region_counts = _list(raw, "region_counts", [2, 4, 8, 16], int)
    if any(k < 1 for k in region_counts):
        raise ConfigError("counts must be at least 1", attr="region_counts")
    if not isinstance(raw.get("adaround_options", {}), dict):
        raise ConfigError("must be a table of adaround attributes", attr="adaround_options")
    return methods, steps, top_k, region_counts


def _calibrations(plan: _Plan, steps: list[str]) -> None:
    extra = [m for step, m in (("percentile_region", "percentile"), ("nncf", NNCF_METHOD))
             if step in steps and m not in plan.methods]
    for m in [*plan.methods, *extra]:
        plan.add(f"calib_{m}", {"rule": "calibrate", "model": plan.model,
                                "dataset": plan.data, "method": m})
        if m == "percentile":  # one calibration, shared by every trial that uses it
            plan.tables[f"{plan.name}.calib_{m}"]["percentile"] = plan.raw.get("percentile",
                                                                               99.99)


def _plain_trials(plan: _Plan, steps: list[str]) -> None:
    """uint8 per channel, and the activation type, granularity and calibration variants."""
    me = plan.me
    plan.quantize("u8", activation_type="uint8", per_channel=True)
    if "activation_type" in steps:
        plan.quantize("i8", activation_type="int8", per_channel=True)
    if "per_channel" in steps:
        plan.quantize("u8_per_tensor", activation_type="uint8", per_channel=False)
    if "calibration" in steps:
        for m in plan.methods[1:]:
            plan.quantize(f"u8_{m}", activation_type="uint8", calibration=f"{me}.calib_{m}")


def _preset_trials(plan: _Plan, steps: list[str]) -> None:
    """NNCF's presets and placement: ``sym`` (symmetric int8 activations and weights) and
    ``nncf`` / ``nncf_bc`` (mean_minmax ranges, preset mixed, Q/DQ at convolution inputs
    only, then fast bias correction: what ``nncf.quantize`` does for OpenVINO)."""
    me = plan.me
    if "symmetric" in steps:
        plan.quantize("sym", preset="symmetric", per_channel=True)
    if "nncf" in steps:
        plan.quantize("nncf", calibration=f"{me}.calib_{NNCF_METHOD}", preset="mixed",
                      placement="conv_inputs", per_channel=True)
        plan.bias_corrected("nncf", method="fast")


def _algorithm_trials(plan: _Plan, steps: list[str]) -> None:
    """Cross-layer equalization, bias correction and AdaRound trials."""
    me, model, data = plan.me, plan.model, plan.data
    if "cle" in steps:  # algorithms.cle: equalized float model, its own calibration
        plan.add("cle_model", {"rule": "equalize", "model": model, "clip": "relu"})
        plan.add("calib_cle", {"rule": "calibrate", "model": f"{me}.cle_model",
                               "dataset": data, "method": plan.methods[0]})
        plan.quantize("cle", model=f"{me}.cle_model", calibration=f"{me}.calib_cle",
                      activation_type="uint8", per_channel=True)
    if "bias_correction" in steps:
        plan.bias_corrected("u8")
    if "adaround" in steps:  # algorithms.adaround: learned rounding of the u8 trial
        plan.add("u8_ar", {"rule": "adaround", "model": f"{me}.u8", "reference": model,
                           "dataset": data, **plan.raw.get("adaround_options", {})})
        plan.trials.append("u8_ar")
        if "cle" in steps:
            plan.add("cle_ar", {"rule": "adaround", "model": f"{me}.cle",
                                "reference": f"{me}.cle_model", "dataset": data,
                                **plan.raw.get("adaround_options", {})})
            plan.trials.append("cle_ar")


def _sensitivity(plan: _Plan, task_attrs: dict[str, Any]) -> None:
    """The ``sens`` ranking of the u8 trial's activations (in shards, then merged)."""
    me, raw = plan.me, plan.raw
    sens = {"rule": "sensitivity", "model": f"{me}.u8", "reference": plan.model,
            "dataset": plan.data, "kinds": ["activation"],
            "max_samples": raw.get("sensitivity_samples", 4), **task_attrs}
    shards = raw.get("sensitivity_shards", 2)
    if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
        raise ConfigError("must be a positive integer", attr="sensitivity_shards")
    if shards == 1:
        plan.add("sens", sens)
        return
    # the ranking is the one long action every region and top-k trial waits for:
    # in shards (sites are independent) it uses every core the build has
    for i in range(shards):
        plan.add(f"sens_s{i}", {**sens, "shard": i, "shards": shards})
    plan.add("sens", {"rule": "sensitivity_merge",
                      "shards": [f"{me}.sens_s{i}" for i in range(shards)]})


def _region_trials(plan: _Plan, steps: list[str], region_counts: list[int]) -> None:
    """The stem/head region of the most sensitive activation (and of the three most)
    kept float; with ``percentile_region``, percentile ranges with the k regions float."""
    me, model = plan.me, plan.model
    if "region" in steps:
        plan.add("region_overrides", {"rule": "sensitive_region", "model": model,
                                      "sensitivity": f"{me}.sens"})
        plan.quantize("region", overrides=f"{me}.region_overrides")
        plan.bias_corrected("region")
        # the next step out: the regions of the three most sensitive activations together
        plan.add("region3_overrides", {"rule": "sensitive_region", "model": model,
                                       "sensitivity": f"{me}.sens", "count": 3})
        plan.quantize("region3", overrides=f"{me}.region3_overrides")
        plan.bias_corrected("region3")
        if "nncf" in steps:  # NNCF's recipe with the same region float
            plan.quantize("nncf_region", calibration=f"{me}.calib_{NNCF_METHOD}",
                          preset="mixed", placement="conv_inputs", per_channel=True,
                          overrides=f"{me}.region_overrides")
            plan.bias_corrected("nncf_region", method="fast")
    if "percentile_region" in steps:
        # percentile ranges (outliers clipped: resolution where the values are) with the
        # union of the stem/head regions of the k most sensitive activations float; the
        # regions are selectors resolved by quantize, the calibration is shared
        for k in region_counts:
            plan.add(f"region_k{k}_overrides", {
                "rule": "sensitive_region", "model": model, "sensitivity": f"{me}.sens",
                "count": k})
            trial = f"pct_region_k{k}"
            plan.quantize(trial, calibration=f"{me}.calib_percentile", activation_type="uint8",
                          per_channel=True, overrides=f"{me}.region_k{k}_overrides")
            plan.bias_corrected(trial)


def _top_k_trials(plan: _Plan, steps: list[str], top_k: list[int]) -> None:
    """The k most sensitive activations float or at uint16; with ``region_uint16``, the
    region float and the next k at uint16."""
    me, model = plan.me, plan.model
    for step, action, prefix in (("float_top_k", "float", "float"),
                                 ("uint16_top_k", "uint16", "u16")):
        if step not in steps:
            continue
        for k in top_k:
            plan.add(f"mp_{prefix}_k{k}", {"rule": "mixed_precision", "model": model,
                                           "sensitivity": f"{me}.sens", "top_k": k,
                                           "action": action})
            plan.quantize(f"{prefix}_k{k}", overrides=f"{me}.mp_{prefix}_k{k}")

    if "region_uint16" in steps:
        for k in top_k:
            trial = f"region_u16_k{k}"
            plan.add(f"{trial}_overrides", {
                "rule": "sensitive_region", "model": model, "sensitivity": f"{me}.sens",
                "promote_uint16": k})
            plan.quantize(trial, overrides=f"{me}.{trial}_overrides")
            plan.bias_corrected(trial)


def _lowered_trials(plan: _Plan) -> None:
    # integer operators change speed, never outputs (the lowering is checked
    # bit-exact), so only the region families' bias-corrected trials are lowered
    for trial in [t for t in plan.trials if t.startswith("region") and t.endswith("_bc")
                  and not t.startswith("region3")]:
        plan.add(f"{trial}_int", {"rule": "lower_integer", "model": f"{plan.me}.{trial}",
                                  "mode": "ort", "float_model": "copy",
                                  "dataset": plan.data,
                                  "max_samples": 2, "min_agreement": 1.0})
        plan.trials.append(f"{trial}_int")


def expand(name: str, raw: dict[str, Any]) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """(extra target tables, the macro target's own raw attributes)."""
    methods, steps, top_k, region_counts = _checked(raw)
    runtime = runtime_of(raw)
    if runtime != ONNXRUNTIME:
        steps = [s for s in steps if s != "lower"]  # onnxruntime's integer operators
    plan = _Plan(name, raw, methods, placement_attrs(runtime))
    # first: nothing calibrates before the selection set is shown to share no image
    # with the calibration set (a refusal stops the build before any trial runs)
    plan.add("calibration_data", {"rule": "disjoint_dataset",
                                  "dataset": raw["calibration_data"],
                                  "disjoint_from": raw["evaluation_data"], "search": name})
    _calibrations(plan, steps)
    _plain_trials(plan, steps)
    _preset_trials(plan, steps)
    _algorithm_trials(plan, steps)
    task_attrs: dict[str, Any] = {k: raw[k] for k in ("task", "task_options", "metric_srcs")
                                  if k in raw}
    if any(s in steps for s in ("region", "percentile_region", "float_top_k", "uint16_top_k",
                                "region_uint16")):
        _sensitivity(plan, task_attrs)
    _region_trials(plan, steps, region_counts)
    _top_k_trials(plan, steps, top_k)
    if "lower" in steps:
        _lowered_trials(plan)
    me, trials = plan.me, plan.trials
    # the trials' findings (slower than float, noisy timing, a selection set too small
    # to decide) go to the search's report with one console line each (auto_select),
    # not one warning per trial
    eval_attrs = {**task_attrs, "latency_runs": raw.get("latency_runs", 20),
                  "latency_warnings": False, "runtime": runtime,
                  "set_warnings": False}
    if "ground_truth" in raw:  # labelled metrics; the selection checks max_drop
        eval_attrs["ground_truth"] = raw["ground_truth"]
    for trial in trials:
        plan.add(f"ev_{trial}", {"rule": "evaluate", "models": [f"{me}.{trial}"],
                                 "reference": plan.model,
                                 "dataset": raw["evaluation_data"], **eval_attrs})
    own = dict(raw)
    own["candidates"] = [f"{me}.{t}" for t in trials]
    own["reports"] = [f"{me}.ev_{t}" for t in trials]
    own["trial_names"] = list(trials)
    own["checked_data"] = plan.data
    if f"{name}.sens" in plan.tables:
        own["sensitivity"] = f"{me}.sens"
    return plan.tables, own
