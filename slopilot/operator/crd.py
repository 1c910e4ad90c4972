"""The LLMDeployment CustomResourceDefinition, built in Python from the engine's knobs.

``python -m slopilot.operator.crd > manifests/crd.yaml`` regenerates the checked-in
manifest; a test keeps the two equal. Cross-field rules the apiserver can check
(replicas.min <= replicas.max, chunkSize <= tokenBudget, tuning.window <=
tuning.maxTrial) are CEL rules here too, and
``parse_spec`` (slopilot.operator.spec) repeats them with messages that name the fix.

There is no scale subresource: ``spec.replicas`` is a range the controller scales within,
not a count, and a ``kubectl scale`` or an HPA writing a count would fight the tuner.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import yaml

from slopilot.operator import twin_spec
from slopilot.operator.alert_spec import (
    ALERT_FIELDS,
    DEFAULT_SCRAPE_INTERVAL_S,
    MAX_SCRAPE_INTERVAL_S,
)
from slopilot.operator.clients_spec import VLLM_REFUSAL, VLLM_RULE, clients_schema
from slopilot.operator.connections_spec import FIELDS as CONNECTION_FIELDS
from slopilot.operator.connections_spec import (
    MAX_CONNECTIONS,
    MAX_CONNECTIONS_DESCRIPTION,
    MAX_CONNECTIONS_RANGE,
)
from slopilot.operator.crd_status import status_schema as _status_schema
from slopilot.operator.crd_types import cel as _cel
from slopilot.operator.crd_types import integer as _int
from slopilot.operator.crd_types import number as _number
from slopilot.operator.crd_types import obj as _obj
from slopilot.operator.crd_types import quantity as _quantity
from slopilot.operator.crd_types import string as _str
from slopilot.operator.knobs import (
    BOUNDED_KNOBS,
    DEFAULT_STUDY_STORAGE,
    DEFAULT_WINDOW,
    KNOB_PATHS,
    MAX_STORAGE_URL,
    MAX_TRIAL_S,
    MAX_WINDOW_S,
    MIN_WINDOW_S,
    VLLM_BLOCK_SIZES,
    knob_range,
    knob_schema,
)
from slopilot.operator.model_source import TOKEN_REFUSAL, TOKEN_RULE, model_schema
from slopilot.operator.scheduling import scheduling_schema
from slopilot.operator.spec import (
    BACKENDS,
    MAX_GPUS,
    MAX_REPLICAS,
    MAX_STARTUP_TIMEOUT_S,
    MIN_STARTUP_TIMEOUT_S,
    PROFILES,
    STARTUP_TIMEOUT_S,
    VLLM_CLASSES,
    LLMDeploymentSpec,
    SpecError,
    parse_spec,
)
from slopilot.operator.study_storage import SIDECAR_MESSAGE, SIDECAR_RULE
from slopilot.operator.validation import MAX_MODEL_REF
from slopilot.tuner.loop.settings import (
    DEFAULT_CLASS_REQUESTS,
    DEFAULT_MAX_TRIAL_S,
    MAX_CLASS_REQUESTS,
)
from slopilot.tuner.prometheus.alert_table import MAX_DURATION_S, MAX_WAITING, MIN_RATE_SCRAPES
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
MAX_DURATION_TEXT = 64
"""Characters of a duration field at most: "1h30m" needs five; the bound also prices the
CEL rule that parses it."""
_PORT = r"([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
_LABEL = r"[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?"
# http(s), a host (a DNS name, an IPv4 address, or an IPv6 address in brackets), an
# optional port 1..65535 and path; no user info, query or fragment
# (validation.prometheus_url_problem says which, for objects that came another way, and
# refuses the same).
PROMETHEUS_URL_PATTERN = (r"^https?://(" + _LABEL + r"(\." + _LABEL + r")*\.?"
                          + r"|\[[0-9A-Fa-f:.]+\])(:(0*" + _PORT + r")?)?(/[^?#\s]*)?$")


def _duration(desc: str, lo_s: float, hi_s: float, *, whole: bool = False,
              **extra: Any) -> dict[str, Any]:
    """A duration string the handler takes only within [lo_s, hi_s] (``whole``: in whole
    seconds), refused the same by the API server: CEL's duration() parses what
    DURATION_PATTERN admits as Go's time.ParseDuration does (one too long for it fails
    the rule)."""
    rule = f"duration(self) >= duration('{lo_s:g}s') && duration(self) <= duration('{hi_s:g}s')"
    message = f"must be between {duration(int(lo_s))} and {duration(int(hi_s))}"
    if whole:
        rule += " && duration(self).getMilliseconds() % 1000 == 0"
        message += ", in whole seconds"
    return _cel(_str(desc, pattern=DURATION_PATTERN, maxLength=MAX_DURATION_TEXT, **extra),
                rule, message)


def _model_schema() -> dict[str, Any]:
    model = model_schema(MAX_MODEL_REF)
    model["properties"]["startupTimeout"] = _duration(
        "How long a pod may take to start, its model downloaded and loaded, before the "
        "kubelet restarts it (the engine's startup probe); default "
        f"{duration(int(STARTUP_TIMEOUT_S))}. A large checkpoint needs longer (e.g. 45m "
        "for 70B on a slow link).", MIN_STARTUP_TIMEOUT_S, MAX_STARTUP_TIMEOUT_S)
    return model


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
        "holdFor": _duration("Prometheus' for of every alert but TBT. The seeds give none; "
                             "2m on purpose: a P99 over a 60 s window moves with one burst, "
                             "and a retune costs live trials, so one noisy evaluation must "
                             "not start one.", 0, MAX_DURATION_S, whole=True,
                             default=duration(d.alert_for_s)),
        "sustainedBreachWindow": _duration(
            "SlopilotTTFTP99Sustained and SlopilotTBTP99Sustained (action retune): a TTFT "
            "P99 over ttftWarningFactor x its SLO, or a TBT P99 over its SLO, measured over "
            "this window (not the 60 s of the others) retunes once it has held for the "
            "longer of this window and holdFor, so a lasting breach under the thresholds "
            "that act at once is not left alone, even when single 60 s windows flap under "
            "the SLO now and then. Left out: "
            f"{duration(d.breach_window_s)}, or the rate window (four scrapeInterval) where "
            "that is longer; at least the rate window.",
            # No schema default: the operator's depends on scrapeInterval, and a stored
            # 5m would refuse every interval over 75s.
            d.rate_window_s, MAX_DURATION_S, whole=True),
        "scrapeInterval": _duration(
            "How often Prometheus scrapes these pods: the ServiceMonitor's 15s, or your own "
            "scrape job's where it scrapes them instead (a 30s job is common). Every rate "
            "the rules read spans four of these (max(1m, 4 x it): 2m at 30s), so a failed "
            "scrape or two does not clear the alerts, and the ScrapeInterval condition "
            "says where Prometheus really scrapes less often than this.",
            1, MAX_SCRAPE_INTERVAL_S, whole=True, default=duration(DEFAULT_SCRAPE_INTERVAL_S)),
        "utilizationMin": _number("SlopilotBatchingUnderused: GPU utilization (DCGM's "
                                  "exporter where it reports the pods, else the built-in "
                                  "engine's busy ratio) under this ratio (seeds: 0.6) ...",
                                  0, 1, exclusiveMinimum=True, default=d.busy_ratio_min),
        "waitingMin": _int("... while more requests than this wait (seeds: 100).", 0,
                           MAX_WAITING, default=d.waiting_min),
    }
    alerts = _cel(_obj({k: desc[k] for k in ALERT_FIELDS}, default={},
                       desc="Alert thresholds; the defaults are the seeds' table "
                            "(docs/operations.md, Alerts)."),
                  "!has(self.ttftWarningFactor) || !has(self.ttftRetuneFactor) || "
                  "self.ttftWarningFactor <= self.ttftRetuneFactor",
                  "ttftWarningFactor must not exceed ttftRetuneFactor: the warning (inform) "
                  "comes before the retune")
    # alert_options' cross-field rule: the sustained rows' window spans at least the rate
    # window, MIN_RATE_SCRAPES scrapes (its own 1m floor is the field's minimum).
    alerts["x-kubernetes-validations"].append({
        "rule": "!has(self.sustainedBreachWindow) || !has(self.scrapeInterval) || "
                "duration(self.sustainedBreachWindow).getSeconds() >= "
                f"{MIN_RATE_SCRAPES} * duration(self.scrapeInterval).getSeconds()",
        "message": f"sustainedBreachWindow must be at least {MIN_RATE_SCRAPES} x "
                   "scrapeInterval (the rules' rate window); leave it out for the longer "
                   f"of {duration(d.breach_window_s)} and that"})
    return alerts


def _spec_schema() -> dict[str, Any]:
    spec = _cel(_obj({
        "backend": _str("Which engine runs in the pods.", enum=list(BACKENDS),
                        default="builtin"),
        "model": _model_schema(),
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
            "ephemeralStorage": _quantity(
                "Ephemeral-storage request and limit per pod, e.g. '200Gi': bounds what "
                "the pod writes to its node (/cache, where vLLM downloads the model, /tmp "
                "and logs); past it the kubelet evicts the pod. Absent: the namespace's "
                "LimitRange default, else unbounded."),
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
        "clients": clients_schema(),
        "scheduling": scheduling_schema(),
        "connections": _obj({**{camel: _duration(f.description, f.lo_s, f.hi_s)
                                for camel, f in CONNECTION_FIELDS.items()},
                             MAX_CONNECTIONS: _int(MAX_CONNECTIONS_DESCRIPTION,
                                                   *MAX_CONNECTIONS_RANGE)},
                            desc="How long the pods' server (the meter's, in front of "
                            "vLLM) keeps a client's connection waiting, and how many it "
                            "holds; a field left out keeps the server's default. A change "
                            "rolls the pods."),
        "tuning": _cel(_obj({
            "enabled": {"type": "boolean", "default": True},
            "window": _duration("How long one live trial observes traffic.",
                                MIN_WINDOW_S, MAX_WINDOW_S, default=DEFAULT_WINDOW),
            # No defaults in the schema for these two: the parser applies the loop's own,
            # and the longest trial's depends on the window.
            "minClassRequests": _int(
                "A trial is judged only once its window holds this many finished requests "
                "of each class with a P99 target that it served (the P99 of fewer is one "
                "of their few largest); until then the trial runs on, up to maxTrial. "
                f"Default {DEFAULT_CLASS_REQUESTS}: lower it only to judge trials on less, "
                "knowingly.", 1, MAX_CLASS_REQUESTS),
            "maxTrial": _duration(
                "The longest one window of a trial runs (its first, and a confirming "
                "one from its own start): a trial "
                "short of minClassRequests by then ends unjudged (too little traffic to "
                "judge), rolled back, and its tuning round with it. The queue a trial "
                "inherits from the overloaded config is waited out before its window "
                "starts, not counted in it, for up to maxTrial from its apply (past that it "
                "is judged on it). At least window. "
                f"Default {duration(int(DEFAULT_MAX_TRIAL_S))}, or window where that is "
                "longer; thin traffic that must still be retuned needs a longer one.",
                MIN_WINDOW_S, MAX_TRIAL_S),
            "maxTrials": _int("Trials per tuning round; the loop starts at most 30 trials "
                              "an hour, or maxTrials where that is more, up to the "
                              "operator's SLOPILOT_MAX_TRIALS_PER_HOUR (default 60).",
                              1, 1000,
                              default=30),
            "canary": {"type": "boolean", "default": True,
                       "description": "Run trials on one replica when there are several."},
            "storage": _cel(_str("Optuna storage URL (sqlite:/// or postgresql://, "
                                 "without a password): one the operator's "
                                 "SLOPILOT_ALLOWED_STORAGE allows for this namespace. An "
                                 "entry with {namespace} there allows only this "
                                 "namespace's own storage (e.g. "
                                 "sqlite:////var/lib/slopilot/teams/<namespace>.db); a "
                                 "refusal names the one to use. Absent: this namespace's "
                                 "default storage, the operator's SLOPILOT_DEFAULT_STORAGE "
                                 f"(unset: {DEFAULT_STUDY_STORAGE}), shown in "
                                 "status.studyStorages.",
                                 pattern=r"^(sqlite|postgresql(\+\w+)?)://",
                                 maxLength=MAX_STORAGE_URL),
                            SIDECAR_RULE, SIDECAR_MESSAGE),
            "bounds": _obj({camel: _bounds(field) for camel, field in BOUNDED_KNOBS.items()},
                           desc=_bounds_doc()),
            "twin": _deprecated_twin_schema(),
        }, default={}), "!has(self.maxTrial) || !has(self.window) || "
           "duration(self.maxTrial) >= duration(self.window)",
           "maxTrial must not be shorter than window: a trial runs one window at least"),
        "prometheus": _obj({
            "url": _str("Prometheus the controller queries: http(s)://host[:port][/path], no "
                        "user info, query or fragment; the operator may restrict the hosts.",
                        pattern=PROMETHEUS_URL_PATTERN, maxLength=2048,
                        default="http://prometheus-operated.monitoring:9090"),
        }, default={}),
        "alerts": _alerts_schema(),
        "twin": _twin_profile_schema(),
    }, required=["model"]), VLLM_RULE, VLLM_REFUSAL)
    lo, hi = knob_range("block_size")
    sizes = ", ".join(str(b) for b in VLLM_BLOCK_SIZES if lo <= b <= hi)
    spec["x-kubernetes-validations"] += [
        {"rule": TOKEN_RULE, "message": TOKEN_REFUSAL},
        {"rule": "!has(self.backend) || self.backend != 'vllm' || !has(self.engine) || "
                 f"!has(self.engine.blockSize) || self.engine.blockSize in [{sizes}]",
         "message": f"backend vllm: engine.blockSize must be one of {sizes} (vLLM's "
                    "--block-size values), or use backend: builtin"}]
    return spec


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
        "without it the twin is the uncalibrated datasheet roofline."), **_twin_settings(),
        "dispatch": _str("How the replicas' traffic is spread, as the twin plans capacity: "
                         "random (the operator's Service, kube-proxy's iptables or nftables "
                         "mode), round_robin (kube-proxy's IPVS mode), least_requests (a "
                         "load-aware router in front); default "
                         f"{twin_spec.DEFAULT_DISPATCH.value}.",
                         enum=list(twin_spec.DISPATCH_CHOICES))},
        desc="The controller's twin (the simulator behind warm starts and capacity plans): "
             "its cost model, and how it is checked and corrected against measurements.")


def openapi_schema() -> dict[str, Any]:
    return _obj({"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                 "metadata": {"type": "object"}, "spec": _spec_schema(),
                 "status": _status_schema()}, required=["spec"])


def crd_manifest() -> dict[str, Any]:
    columns = [("Phase", "string", ".status.phase"), ("Replicas", "integer", ".status.replicas"),
               ("Ready", "integer", ".status.readyReplicas"),
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


def main(argv: Sequence[str] | None = None) -> int:
    """Print the CRD's YAML (``manifests/crd.yaml``), once the arguments parse."""
    argparse.ArgumentParser(
        prog="python -m slopilot.operator.crd",
        description="Print the LLMDeployment CRD as YAML on stdout; regenerate the "
        "checked-in copy with: python -m slopilot.operator.crd > manifests/crd.yaml",
    ).parse_args(argv)
    sys.stdout.write(crd_yaml())
    return 0


if __name__ == "__main__":
    sys.exit(main())
