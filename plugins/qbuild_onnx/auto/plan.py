"""The trial plan of ``auto_quantize``: which ordinary targets the macro expands to.

For ``[aq] rule = "auto_quantize"`` the package gains, in this order (cheapest ideas
first), every one an ordinary cached target:

* ``aq.calib_<method>``: ``calibrate`` of the model on the calibration data, one per
  method, shared by every trial that uses the method;
* trials (``quantize`` unless noted), each with an ``evaluate`` target ``aq.ev_<trial>``
  on the evaluation data with the task and latency measurement:
  ``u8`` (uint8 activations, per-channel weights, first calibration method), ``i8``
  (int8 activations), ``u8_per_tensor``, ``u8_<method>`` (other calibration methods),
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

A trial may fail (or quantize nothing) without failing the search: the ``aq`` target
tolerates its candidates', reports' and sensitivity's failures (``tolerate_failures``),
reports each failed trial with its one-line reason and excludes it; it fails only when
every trial failed. A failure is never cached, so the next build tries the trial again.

The ``aq`` target itself only selects, so changing the bar or the objective reruns the
selection alone; adding a top-k value or a step adds only its own targets.
"""

from __future__ import annotations

from typing import Any

from qbuild import ConfigError

STEPS = ("activation_type", "per_channel", "calibration", "cle", "bias_correction",
         "adaround", "region", "percentile_region", "float_top_k", "uint16_top_k",
         "region_uint16", "lower")
_GENERATED = ("candidates", "reports", "trial_names", "sensitivity")


def _list(raw: dict[str, Any], key: str, default: list[Any], kind: type) -> list[Any]:
    value = raw.get(key, default)
    if not isinstance(value, list) or not all(isinstance(v, kind) and not isinstance(v, bool)
                                              for v in value):
        raise ConfigError(f"must be a list of {kind.__name__}", attr=key)
    return value


def expand(name: str, raw: dict[str, Any]) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """(extra target tables, the macro target's own raw attributes)."""
    for key in _GENERATED:
        if key in raw:
            raise ConfigError("is filled in by auto_quantize itself; do not set it", attr=key)
    for key in ("model", "calibration_data", "evaluation_data"):
        if not isinstance(raw.get(key), str):
            raise ConfigError("missing required attribute (label)", attr=key)
    methods = _list(raw, "calibration_methods", ["minmax", "percentile"], str)
    if not methods:
        raise ConfigError("needs at least one method", attr="calibration_methods")
    steps = _list(raw, "steps", [s for s in STEPS if s != "adaround"], str)
    bad = [s for s in steps if s not in STEPS]
    if bad:
        raise ConfigError(f"unknown step '{bad[0]}' (known: {', '.join(STEPS)})", attr="steps")
    top_k = _list(raw, "top_k", [2, 8], int)
    region_counts = _list(raw, "region_counts", [2, 4, 8, 16], int)
    if any(k < 1 for k in region_counts):
        raise ConfigError("counts must be at least 1", attr="region_counts")
    if not isinstance(raw.get("adaround_options", {}), dict):
        raise ConfigError("must be a table of adaround attributes", attr="adaround_options")
    model = raw["model"]
    me = f":{name}"
    tables: dict[str, dict[str, Any]] = {}
    trials: list[str] = []

    pct = "percentile_region" in steps
    for m in [*methods, *(["percentile"] if pct and "percentile" not in methods else [])]:
        tables[f"{name}.calib_{m}"] = {"rule": "calibrate", "model": model,
                                       "dataset": raw["calibration_data"], "method": m}
        if m == "percentile":  # one calibration, shared by every trial that uses it
            tables[f"{name}.calib_{m}"]["percentile"] = raw.get("percentile", 99.99)

    def quantize(trial: str, **attrs: Any) -> None:
        tables[f"{name}.{trial}"] = {"rule": "quantize", "model": model,
                                     "calibration": f"{me}.calib_{methods[0]}", **attrs}
        trials.append(trial)

    quantize("u8", activation_type="uint8", per_channel=True)
    if "activation_type" in steps:
        quantize("i8", activation_type="int8", per_channel=True)
    if "per_channel" in steps:
        quantize("u8_per_tensor", activation_type="uint8", per_channel=False)
    if "calibration" in steps:
        for m in methods[1:]:
            quantize(f"u8_{m}", activation_type="uint8", calibration=f"{me}.calib_{m}")
    if "cle" in steps:  # algorithms.cle: equalized float model, its own calibration
        tables[f"{name}.cle_model"] = {"rule": "equalize", "model": model, "clip": "relu"}
        tables[f"{name}.calib_cle"] = {"rule": "calibrate", "model": f"{me}.cle_model",
                                       "dataset": raw["calibration_data"],
                                       "method": methods[0]}
        quantize("cle", model=f"{me}.cle_model", calibration=f"{me}.calib_cle",
                 activation_type="uint8", per_channel=True)
    if "bias_correction" in steps:
        tables[f"{name}.u8_bc"] = {"rule": "bias_correction", "model": f"{me}.u8",
                                   "reference": model, "dataset": raw["calibration_data"]}
        trials.append("u8_bc")
    if "adaround" in steps:  # algorithms.adaround: learned rounding of the u8 trial
        tables[f"{name}.u8_ar"] = {"rule": "adaround", "model": f"{me}.u8",
                                   "reference": model, "dataset": raw["calibration_data"],
                                   **raw.get("adaround_options", {})}
        trials.append("u8_ar")
        if "cle" in steps:
            tables[f"{name}.cle_ar"] = {"rule": "adaround", "model": f"{me}.cle",
                                        "reference": f"{me}.cle_model",
                                        "dataset": raw["calibration_data"],
                                        **raw.get("adaround_options", {})}
            trials.append("cle_ar")
    task_attrs: dict[str, Any] = {k: raw[k] for k in ("task", "task_options", "metric_srcs")
                                  if k in raw}
    if any(s in steps for s in ("region", "percentile_region", "float_top_k", "uint16_top_k",
                                "region_uint16")):
        sens = {"rule": "sensitivity", "model": f"{me}.u8", "reference": model,
                "dataset": raw["calibration_data"], "kinds": ["activation"],
                "max_samples": raw.get("sensitivity_samples", 4), **task_attrs}
        shards = raw.get("sensitivity_shards", 2)
        if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
            raise ConfigError("must be a positive integer", attr="sensitivity_shards")
        if shards == 1:
            tables[f"{name}.sens"] = sens
        else:
            # the ranking is the one long action every region and top-k trial waits for:
            # in shards (sites are independent) it uses every core the build has
            for i in range(shards):
                tables[f"{name}.sens_s{i}"] = {**sens, "shard": i, "shards": shards}
            tables[f"{name}.sens"] = {"rule": "sensitivity_merge",
                                      "shards": [f"{me}.sens_s{i}" for i in range(shards)]}
    if "region" in steps:
        tables[f"{name}.region_overrides"] = {"rule": "sensitive_region", "model": model,
                                              "sensitivity": f"{me}.sens"}
        quantize("region", overrides=f"{me}.region_overrides")
        tables[f"{name}.region_bc"] = {"rule": "bias_correction", "model": f"{me}.region",
                                       "reference": model, "dataset": raw["calibration_data"]}
        trials.append("region_bc")
        # the next step out: the regions of the three most sensitive activations together
        tables[f"{name}.region3_overrides"] = {"rule": "sensitive_region", "model": model,
                                               "sensitivity": f"{me}.sens", "count": 3}
        quantize("region3", overrides=f"{me}.region3_overrides")
        tables[f"{name}.region3_bc"] = {"rule": "bias_correction", "model": f"{me}.region3",
                                        "reference": model,
                                        "dataset": raw["calibration_data"]}
        trials.append("region3_bc")
    if pct:
        # percentile ranges (outliers clipped: resolution where the values are) with the
        # union of the stem/head regions of the k most sensitive activations float; the
        # regions are selectors resolved by quantize, the calibration is shared
        for k in region_counts:
            tables[f"{name}.region_k{k}_overrides"] = {
                "rule": "sensitive_region", "model": model, "sensitivity": f"{me}.sens",
                "count": k}
            trial = f"pct_region_k{k}"
            quantize(trial, calibration=f"{me}.calib_percentile", activation_type="uint8",
                     per_channel=True, overrides=f"{me}.region_k{k}_overrides")
            tables[f"{name}.{trial}_bc"] = {"rule": "bias_correction",
                                            "model": f"{me}.{trial}", "reference": model,
                                            "dataset": raw["calibration_data"]}
            trials.append(f"{trial}_bc")
    for step, action, prefix in (("float_top_k", "float", "float"),
                                 ("uint16_top_k", "uint16", "u16")):
        if step not in steps:
            continue
        for k in top_k:
            tables[f"{name}.mp_{prefix}_k{k}"] = {"rule": "mixed_precision", "model": model,
                                                  "sensitivity": f"{me}.sens", "top_k": k,
                                                  "action": action}
            quantize(f"{prefix}_k{k}", overrides=f"{me}.mp_{prefix}_k{k}")

    if "region_uint16" in steps:
        for k in top_k:
            trial = f"region_u16_k{k}"
            tables[f"{name}.{trial}_overrides"] = {
                "rule": "sensitive_region", "model": model, "sensitivity": f"{me}.sens",
                "promote_uint16": k}
            quantize(trial, overrides=f"{me}.{trial}_overrides")
            tables[f"{name}.{trial}_bc"] = {"rule": "bias_correction", "model": f"{me}.{trial}",
                                            "reference": model,
                                            "dataset": raw["calibration_data"]}
            trials.append(f"{trial}_bc")
    if "lower" in steps:
        # integer operators change speed, never outputs (the lowering is checked
        # bit-exact), so only the region families' bias-corrected trials are lowered
        for trial in [t for t in trials if t.startswith("region") and t.endswith("_bc")
                      and not t.startswith("region3")]:
            tables[f"{name}.{trial}_int"] = {"rule": "lower_integer", "model": f"{me}.{trial}",
                                             "mode": "ort", "float_model": "copy",
                                             "dataset": raw["calibration_data"],
                                             "max_samples": 2, "min_agreement": 1.0}
            trials.append(f"{trial}_int")
    eval_attrs = {**task_attrs, "latency_runs": raw.get("latency_runs", 20)}
    for trial in trials:
        tables[f"{name}.ev_{trial}"] = {"rule": "evaluate", "models": [f"{me}.{trial}"],
                                        "reference": model,
                                        "dataset": raw["evaluation_data"], **eval_attrs}
    own = dict(raw)
    own["candidates"] = [f"{me}.{t}" for t in trials]
    own["reports"] = [f"{me}.ev_{t}" for t in trials]
    own["trial_names"] = list(trials)
    if f"{name}.sens" in tables:
        own["sensitivity"] = f"{me}.sens"
    return tables, own
