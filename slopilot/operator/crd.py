"""The LLMDeployment CustomResourceDefinition, built in Python from the engine's knobs.

``python -m slopilot.operator.crd > manifests/crd.yaml`` regenerates the checked-in
manifest; a test keeps the two equal. Cross-field rules the apiserver can check
(replicas.min <= replicas.max, chunkSize <= tokenBudget) are CEL rules here too, and
``parse_spec`` (slopilot.operator.spec) repeats them with messages that name the fix.

There is no scale subresource: ``spec.replicas`` is a range the controller scales within,
not a count, and a ``kubectl scale`` or an HPA writing a count would fight the tuner.
"""

from __future__ import annotations

import sys
from typing import Any

import yaml

from slopilot.operator import twin_spec
from slopilot.operator.alert_spec import ALERT_FIELDS
from slopilot.operator.knobs import BOUNDED_KNOBS, KNOB_PATHS, knob_schema
from slopilot.operator.spec import (
    BACKENDS,
    DEFAULT_STUDY_STORAGE,
    MAX_GPUS,
    MAX_REPLICAS,
    PHASES,
    PROFILES,
    VLLM_CLASSES,
    LLMDeploymentSpec,
    SpecError,
    parse_spec,
)
from slopilot.tuner.prometheus.rules import RuleOptions, duration
from slopilot.tuner.study.bounds import DEFAULT_BOUNDS, IntRange

__all__ = ["GROUP", "KIND", "PLURAL", "VERSION", "LLMDeploymentSpec", "SpecError",
           "crd_manifest", "crd_yaml", "openapi_schema", "parse_spec"]

GROUP = "slopilot.dev"
VERSION = "v1alpha1"
PLURAL = "llmdeployments"
KIND = "LLMDeployment"
API_VERSION = f"{GROUP}/{VERSION}"
DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"
# resource.Quantity, as controller-gen writes it for Kubernetes' own types.
QUANTITY_PATTERN = (r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
                    r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$")
# http(s), a host, an optional port and path; no user info, query or fragment
# (validation.prometheus_url_problem says which, for objects that came another way).
PROMETHEUS_URL_PATTERN = r"^https?://[^/?#@\s]+(/[^?#\s]*)?$"


def _obj(props: dict[str, Any], *, required: list[str] | None = None,
         desc: str | None = None, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object"}
    if desc:
        out["description"] = desc
    out["properties"] = props
    if required:
        out["required"] = required
    out.update(extra)
    return out


def _cel(schema: dict[str, Any], rule: str, message: str) -> dict[str, Any]:
    """Attach a CEL rule the apiserver checks (cross-field rules)."""
    return {**schema, "x-kubernetes-validations": [{"rule": rule, "message": message}]}


def _preserve(schema: dict[str, Any]) -> dict[str, Any]:
    """Let the controller store fields the schema does not list (free-form status)."""
    return {**schema, "x-kubernetes-preserve-unknown-fields": True}


def _int(desc: str, lo: int | None = None, hi: int | None = None, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "integer", "description": desc}
    if lo is not None:
        out["minimum"] = lo
    if hi is not None:
        out["maximum"] = hi
    return {**out, **extra}


def _str(desc: str, **extra: Any) -> dict[str, Any]:
    return {"type": "string", "description": desc, **extra}


def _quantity(desc: str) -> dict[str, Any]:
    """An int-or-string resource quantity (``4``, ``'500m'``, ``'16Gi'``)."""
    return {"description": desc, "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": QUANTITY_PATTERN, "x-kubernetes-int-or-string": True}


def _engine_schema() -> dict[str, Any]:
    top: dict[str, Any] = {}
    preemption: dict[str, Any] = {}
    for path, field in KNOB_PATHS.items():
        (preemption if path[0] == "preemption" else top)[path[-1]] = knob_schema(field)
    top["preemption"] = _obj(preemption, desc="How running requests are preempted when KV "
                             "blocks run out.")
    return _cel(_obj(top, desc="Engine knobs; unset ones come from the slo.profile preset. "
                     "The tuner moves them within tuning.bounds."),
                "!has(self.chunkSize) || !has(self.tokenBudget) || "
                "self.chunkSize <= self.tokenBudget", "chunkSize must not exceed tokenBudget")


def _class_target(desc: str) -> dict[str, Any]:
    return _obj({
        "ttftP99Ms": {"type": "number", "minimum": 1, "maximum": 600000,
                      "description": "P99 time to first token, milliseconds."},
        "tbtP99Ms": {"type": "number", "minimum": 1, "maximum": 60000,
                     "description": "P99 time between tokens, milliseconds."},
    }, desc=desc)


def _bounds_doc() -> str:
    ends = ", ".join(f"{camel} {b.lo}..{b.hi}" for camel, field in BOUNDED_KNOBS.items()
                     if isinstance(b := DEFAULT_BOUNDS[field], IntRange))
    return (f"Search ranges of the tuner, within the knobs' own. An end or a knob left out "
            f"is what `slopilot tune` searches: {ends}.")


def _bounds(field: str) -> dict[str, Any]:
    knob = knob_schema(field)
    edge = {k: v for k, v in knob.items() if k in ("type", "minimum", "maximum")}
    return _cel(_obj({"min": dict(edge), "max": dict(edge)}, desc=f"Search range of {field}."),
                "!has(self.min) || !has(self.max) || self.min <= self.max",
                "min must not exceed max")


def _number(desc: str, lo: float, hi: float | None = None, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "number", "description": desc, "minimum": lo}
    if hi is not None:
        out["maximum"] = hi
    return {**out, **extra}


def _alerts_schema() -> dict[str, Any]:
    """``spec.alerts``: the alert table's thresholds (alert_table.py), defaulted to the seeds'."""
    d = RuleOptions()
    desc = {
        "tbtScaleFactor": _number("SlopilotTBTP99High (action scale) fires above this "
                                  "multiple of a class's TBT SLO (seeds: 2).", 1,
                                  default=d.tbt_factor),
        "tbtPeriods": _int("... once it has held at this many consecutive rule evaluations "
                           "(every 30 s; seeds: 3, i.e. for: 1m).", 1, 100,
                           default=d.tbt_periods),
        "ttftWarningFactor": _number("SlopilotTTFTP99High warning (action inform) above this "
                                     "multiple of a class's TTFT SLO (seeds: 1).", 1,
                                     default=d.ttft_warning_factor),
        "ttftRetuneFactor": _number("SlopilotTTFTP99High critical (action retune) above "
                                    "this multiple (seeds: 2, their 1 s for the 500 ms P1 "
                                    "SLO).", 1, default=d.ttft_retune_factor),
        "holdFor": _str("Prometheus' for of every alert but TBT. The seeds give none; 2m "
                        "on purpose: a P99 over a 60 s window moves with one burst, and a "
                        "retune costs live trials, so one noisy evaluation must not start "
                        "one.", pattern=DURATION_PATTERN, default=duration(d.alert_for_s)),
        "sustainedBreachWindow": _str(
            "SlopilotTTFTP99Sustained and SlopilotTBTP99Sustained (action retune): a TTFT "
            "P99 over ttftWarningFactor x its SLO, or a TBT P99 over its SLO, measured over "
            "this window (not the 60 s of the others) retunes after holdFor, so a lasting "
            "breach under the thresholds that act at once is not left alone, even when "
            "single 60 s windows flap under the SLO now and then.",
            pattern=DURATION_PATTERN, default=duration(d.breach_window_s)),
        "utilizationMin": _number("SlopilotBatchingUnderused: GPU utilization (DCGM's "
                                  "exporter where it reports the pods, else the built-in "
                                  "engine's busy ratio) under this ratio (seeds: 0.6) ...",
                                  0, 1, exclusiveMinimum=True, default=d.busy_ratio_min),
        "waitingMin": _int("... while more requests than this wait (seeds: 100).", 0,
                           default=d.waiting_min),
    }
    return _obj({k: desc[k] for k in ALERT_FIELDS}, default={},
                desc="Alert thresholds; the defaults are the seeds' table "
                     "(docs/operations.md, Alerts).")


def _spec_schema() -> dict[str, Any]:
    return _obj({
        "backend": _str("Which engine runs in the pods.", enum=list(BACKENDS),
                        default="builtin"),
        "model": _obj({
            "name": _str("Model name, served as the OpenAI model id.", minLength=1),
            "path": _str("Where the weights are in the pod (a mounted volume); "
                         "the name is used when absent."),
        }, required=["name"]),
        "image": _str("Container image; the backend's default when absent. The operator "
                      "runs only images on its allow-list.", maxLength=4096),
        "replicas": _cel(_obj({
            "min": _int("Fewest replicas the controller keeps.", 0, default=1),
            "max": _int(f"Most replicas the controller scales to (at most {MAX_REPLICAS}).", 1,
                        MAX_REPLICAS, default=1),
        }, default={}), "self.min <= self.max", "replicas.min must not exceed replicas.max"),
        "resources": _obj({
            "gpu": _int("GPUs per pod (nvidia.com/gpu).", 0, MAX_GPUS, default=0),
            "cpu": _quantity("CPU request and limit per pod, e.g. 4 or '500m'."),
            "memory": _quantity("Memory request and limit per pod, e.g. '16Gi'."),
        }, default={}),
        "engine": _engine_schema(),
        "slo": _obj({
            "profile": _str("Latency tier; picks the knob preset and default targets.",
                            enum=list(PROFILES), default="standard"),
            "classes": _obj({f"p{i}": _class_target(f"Targets of priority class P{i}.")
                             for i in range(3)}),
            "maxPreemptionsPerMinute": {"type": "number", "minimum": 0,
                                        "exclusiveMinimum": True, "default": 10,
                                        "description": "Preemption-storm threshold "
                                                       "(SlopilotPreemptionStorm, retune)."},
            "prefixHitMin": _number("Where prefix caching is expected (multi-turn chat): "
                                    "SlopilotPrefixCacheHitLow (action inform) fires when "
                                    "the prefix cache hit ratio is under this (seeds: "
                                    "0.95). Absent: no such alert.", 0, 1,
                                    exclusiveMinimum=True),
            "vllmClass": _str("backend vllm: the class every request counts as (vLLM's "
                              "metrics carry no priority class).",
                              enum=list(VLLM_CLASSES), default="p0"),
        }, default={}),
        "tuning": _obj({
            "enabled": {"type": "boolean", "default": True},
            "window": _str("How long one live trial observes traffic.",
                           pattern=DURATION_PATTERN, default="2m"),
            "maxTrials": _int("Trials per tuning round.", 1, 1000, default=30),
            "canary": {"type": "boolean", "default": True,
                       "description": "Run trials on one replica when there are several."},
            "storage": _str("Optuna storage URL (sqlite:/// or postgresql://, without a "
                            "password): one the operator's SLOPILOT_ALLOWED_STORAGE lists.",
                            pattern=r"^(sqlite|postgresql(\+\w+)?)://",
                            default=DEFAULT_STUDY_STORAGE),
            "bounds": _obj({camel: _bounds(field) for camel, field in BOUNDED_KNOBS.items()},
                           desc=_bounds_doc()),
            "twin": _deprecated_twin_schema(),
        }, default={}),
        "prometheus": _obj({
            "url": _str("Prometheus the controller queries: http(s)://host[:port][/path], no "
                        "user info, query or fragment; the operator may restrict the hosts.",
                        pattern=PROMETHEUS_URL_PATTERN, maxLength=2048,
                        default="http://prometheus-operated.monitoring:9090"),
        }, default={}),
        "alerts": _alerts_schema(),
        "twin": _twin_profile_schema(),
    }, required=["model"])


def _twin_settings(note: str = "") -> dict[str, dict[str, Any]]:
    """maxError and correction, without a default: the parser applies it, as one in the
    schema could not tell a value the user wrote from one the API server filled in."""
    return {
        "maxError": {"type": "number", "minimum": 0, "exclusiveMinimum": True,
                     "maximum": twin_spec.MAX_ERROR_BOUND, "exclusiveMaximum": True,
                     "description": f"{note}The twin's corrected step-time error on the last "
                                    "window above which its warm starts and capacity plans "
                                    "are not trusted (live trials instead); default "
                                    f"{twin_spec.DEFAULT_MAX_ERROR}."},
        "correction": _str(f"{note}How the twin is corrected from the last window's "
                           "iterations (docs/twin.md); default "
                           f"{twin_spec.DEFAULT_CORRECTION.value}.",
                           enum=list(twin_spec.CORRECTIONS)),
    }


def _deprecated_twin_schema() -> dict[str, Any]:
    # Kept in the schema: without it the API server would prune these fields from the
    # objects that have them, silently; parse_spec reads them and warns.
    note = "Deprecated: moved to spec.twin; still read, with a warning. "
    return _obj(_twin_settings(note), desc=f"{note}Remove it and set spec.twin instead.")


def _twin_profile_schema() -> dict[str, Any]:
    return _obj({"profile": _obj({
        "configMapName": _str(
            "A ConfigMap in this LLMDeployment's namespace (a name only: the operator "
            "reads no other namespace's ConfigMaps for it).", pattern=twin_spec.NAME_PATTERN,
            maxLength=twin_spec.MAX_NAME),
        "key": _str("The data key holding the profile YAML (`slopilot calibrate --out`).",
                    pattern=twin_spec.KEY_PATTERN, maxLength=twin_spec.MAX_NAME,
                    default=twin_spec.DEFAULT_KEY),
    }, required=["configMapName"], desc="A calibrated cost profile for the controller's twin; "
        "without it the twin is the uncalibrated datasheet roofline."), **_twin_settings()},
        desc="The controller's twin (the simulator behind warm starts and capacity plans): "
             "its cost model, and how it is checked and corrected against measurements.")


def _status_schema() -> dict[str, Any]:
    condition = _obj({
        "type": _str("Condition type."), "status": _str("", enum=["True", "False", "Unknown"]),
        "reason": _str("CamelCase reason."), "message": _str("Human-readable detail."),
        "lastTransitionTime": _str("", format="date-time"),
        "observedGeneration": _int("", 0),
    }, required=["type", "status"])
    return _obj({
        "phase": _str("Lifecycle phase.", enum=list(PHASES)),
        "observedGeneration": _int("Generation the status describes.", 0),
        "replicas": _int("Replicas running now.", 0),
        "config": _preserve(_obj({"tokenBudget": {"type": "integer"},
                                  "chunkSize": {"type": "integer"}}, desc="Live engine knobs.")),
        "bestTrial": _preserve(_obj({}, desc="Best trial of the study so far.")),
        "trials": _int("Trials run so far.", 0),
        "sloAttainment": {"type": "number", "minimum": 0, "maximum": 1,
                          "description": "Share of the output tokens of the last window "
                                         "whose requests met their class's SLO (goodput "
                                         "over throughput)."},
        "ttftP99Ms": {"type": "number", "description": "Measured P99 TTFT of the last "
                                                       "window (the worst class)."},
        "tbtP99Ms": {"type": "number", "description": "Measured P99 TBT of the last window "
                                                      "(the worst class)."},
        "measuredAt": _str("End of the window the measured figures describe.",
                           format="date-time"),
        "adminTokenSecret": _str("The Secret the operator created with the engines' admin "
                                 "token (owned by this LLMDeployment)."),
        "lastAction": _obj({
            "action": _str("retune, trial, commit, revert, scale, hold, inform."),
            "reason": _str("Why, in one line."),
            "time": _str("When.", format="date-time"),
        }, desc="The controller's last action."),
        "twin": _twin_schema(),
        "controller": _preserve(_obj({}, desc="The controller's persisted loop state: a "
                                     "restarted operator resumes it instead of acting twice.")),
        "tunedConfig": _preserve(_obj({}, desc="Knobs committed by the tuner (engine) and a "
                                      "hash of the spec they were tuned from (base).")),
        "conditions": {"type": "array", "items": condition,
                       "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    })


def _twin_schema() -> dict[str, Any]:
    num = {"type": "number", "nullable": True}
    per_class = _obj({k: {**num, "description": d} for k, d in (
        ("ttftP99PredictedMs", "The twin's P99 TTFT for the window."),
        ("ttftP99MeasuredMs", "The measured P99 TTFT."),
        ("tbtP99PredictedMs", "The twin's P99 TBT for the window."),
        ("tbtP99MeasuredMs", "The measured P99 TBT."),
        ("ttftP99Error", "(predicted - measured) / measured P99 TTFT."),
        ("tbtP99Error", "(predicted - measured) / measured P99 TBT."))})
    return _obj({
        "checkedAt": {"type": "number", "description": "End of the checked window "
                      "(seconds on the controller's clock)."},
        "windowS": {"type": "number", "description": "Length of the checked window."},
        "trusted": {"type": "boolean", "description": "Whether the controller takes "
                    "warm starts and capacity plans from the twin (else: live trials)."},
        "reason": _str("Why (the error against the bound)."),
        "correction": _str("How the twin was corrected.", enum=["none", "rescale", "refit"]),
        "stepTimeError": {**num, "description": "Step-time error of the twin as "
                          "calibrated, (predicted - measured) / measured."},
        "correctedStepTimeError": {**num, "description": "The same after correction, on "
                                   "iterations the correction was not fitted on."},
        "classes": {"type": "object", "additionalProperties": per_class,
                    "description": "Per priority class (p0, p1, p2)."},
        "profile": _obj({
            "calibrated": {"type": "boolean",
                           "description": "Whether the twin runs a calibrated profile."},
            "source": _str("Where its profile came from (ConfigMap namespace/name and key)."),
            "runs": _str("What the twin runs, in one line."),
        }, desc="What the twin runs: a calibrated profile or the uncalibrated datasheet."),
    }, desc="The controller's twin: what it runs (profile) and its check against the last "
            "measured window (the other fields; docs/twin.md).")


def openapi_schema() -> dict[str, Any]:
    return _obj({"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                 "metadata": {"type": "object"}, "spec": _spec_schema(),
                 "status": _status_schema()}, required=["spec"])


def crd_manifest() -> dict[str, Any]:
    columns = [("Phase", "string", ".status.phase"), ("Replicas", "integer", ".status.replicas"),
               ("Budget", "integer", ".status.config.tokenBudget"),
               ("Chunk", "integer", ".status.config.chunkSize"),
               ("TTFT P99", "number", ".status.ttftP99Ms"),
               ("TBT P99", "number", ".status.tbtP99Ms"),
               ("SLO", "number", ".status.sloAttainment"),
               ("Age", "date", ".metadata.creationTimestamp")]
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP, "scope": "Namespaced",
            "names": {"plural": PLURAL, "singular": "llmdeployment", "kind": KIND,
                      "listKind": f"{KIND}List", "shortNames": ["llmd"],
                      "categories": ["slopilot"]},
            "versions": [{
                "name": VERSION, "served": True, "storage": True,
                "schema": {"openAPIV3Schema": openapi_schema()},
                "subresources": {"status": {}},
                "additionalPrinterColumns": [
                    {"name": n, "type": t, "jsonPath": p} for n, t, p in columns],
            }],
        },
    }


def crd_yaml() -> str:
    header = "# GENERATED by `python -m slopilot.operator.crd`; do not edit by hand.\n"
    return header + yaml.safe_dump(crd_manifest(), sort_keys=False, width=100)


if __name__ == "__main__":
    sys.stdout.write(crd_yaml())
