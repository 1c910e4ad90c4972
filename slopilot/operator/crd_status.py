"""The LLMDeployment's status schema: what the operator and its controller write.

Every field is typed, down to its values: no ``x-kubernetes-preserve-unknown-fields``.
The status is written by whoever holds the status subresource, and the API server
serves the CR whole to every list and watch of the operator, which reads JSON to about
1,000 levels of nesting (Python's recursion limit) where the API server stores 10,000.
A free-form field let one tenant store a value 1,000 levels deep (a few kilobytes):
kopf's list and watch of every namespace's LLMDeployments failed on it, its watcher
died and no CR was served again, across restarts too. Typed, the API server prunes a
field the schema does not declare and refuses a map where a value belongs, so no status
nests deeper than the schema. The loop state (``status.controller``) is typed from
``LoopState``'s fields, so a field added there is kept; a free-form one (a ``dict``)
needs its schema here (``_DICT_FIELDS``), or building the CRD fails.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from typing import Any

from slopilot.engine.config import EngineConfig
from slopilot.operator.crd_types import integer as _int
from slopilot.operator.crd_types import obj as _obj
from slopilot.operator.crd_types import string as _str
from slopilot.operator.knobs import KNOB_PATHS, MAX_STORAGE_URL, engine_field
from slopilot.operator.spec import PHASES
from slopilot.operator.study_storage import MAX_STUDY_STORAGES
from slopilot.tuner.loop.state import LoopState


def status_schema() -> dict[str, Any]:
    condition = _obj({
        "type": _str("Condition type."), "status": _str("", enum=["True", "False", "Unknown"]),
        "reason": _str("CamelCase reason."), "message": _str("Human-readable detail."),
        "lastTransitionTime": _str("", format="date-time"),
        "observedGeneration": _int("", 0),
    }, required=["type", "status"])
    return _obj({
        "phase": _str("Lifecycle phase.", enum=list(PHASES)),
        "observedGeneration": _int("Generation the status describes.", 0),
        "replicas": _int("Replicas asked for (the Deployment's spec.replicas).", 0),
        "readyReplicas": _int("Replicas ready to serve now (fewer than asked while new "
                              "pods start, or while a quota or the nodes refuse them).", 0),
        "config": _config_schema(),
        "bestTrial": _obj({"config": _knobs("The best trial's knobs."),
                           "goodputTokS": {"type": "number"}},
                          desc="Best trial of the study so far."),
        "trials": _int("Trials run so far.", 0),
        "sloAttainment": {"type": "number", "minimum": 0, "maximum": 1,
                          "description": "Share of the output tokens of the last window "
                                         "whose requests met their class's SLO (goodput "
                                         "over throughput)."},
        "ttftP99Ms": {"type": "number", "description": "Measured P99 TTFT of the last "
                      "window, every class together (the worst class's where the source "
                      "has no overall figure)."},
        "tbtP99Ms": {"type": "number", "description": "Measured P99 TBT of the last window, "
                     "every class together (the worst class's where the source has no "
                     "overall figure)."},
        "measuredAt": _str("End of the window the measured figures describe.",
                           format="date-time"),
        "lastAction": _obj({
            "action": _str("retune, trial, commit, revert, scale, hold, inform."),
            "reason": _str("Why, in one line."),
            "time": _str("When.", format="date-time"),
        }, desc="The controller's last action."),
        "twin": _twin_schema(),
        "controller": _fields_schema(
            LoopState, "The controller's persisted loop state: a restarted operator "
            "resumes it instead of acting twice."),
        "tunedConfig": _obj({
            "engine": _knobs("The knobs every replica runs."),
            "base": _str("Hash of spec.engine and spec.slo they were tuned from (their "
                         "members equal to the CRD's defaults left out)."),
            "backend": _str("The backend they were tuned on (absent: the spec's)."),
            "model": _str("The model they were tuned for, spec.model.path or else its "
                          "name (absent: the spec's)."),
            "trial": {"type": "boolean"},
            "committed": _knobs("During a trial: the committed knobs it runs over."),
        }, desc="Knobs committed by the tuner (engine), a hash of the spec they were "
                "tuned from (base), the backend and model they were tuned on; during a "
                "trial on every replica, the trial's knobs (trial: true) beside the "
                "committed ones (committed)."),
        "pods": _obj({
            "notConfigured": {
                "type": "array", "items": {"type": "string"}, "maxItems": 64,
                "description": "The pods the PodsConfigured condition names (the "
                               "condition is written again when these, its status or "
                               "its reason change, not when only what a pod answered "
                               "does). A pod named stays named until two syncs in a "
                               "row find it right (more for one that keeps coming "
                               "back)."},
            "held": {
                "type": "array", "maxItems": 128, "description": "Pods not sent a "
                "document (path: /admin/config or /admin/slo; sent: its digest) again: "
                "they took it and answered another. Held until the pod (uid), its engine's "
                "restarts, the spec's generation or the document change.",
                "items": _obj({"pod": _str("Pod name."), "uid": _str("Pod uid."),
                               "restarts": _int("Engine container restarts.", 0),
                               "generation": _int("Spec generation.", 0),
                               "path": _str("The admin API path."),
                               "sent": _str("Digest of the document sent.")})},
        }, desc="What the last sync of the pods' live knobs found (built-in engine)."),
        "studyStorages": {
            "type": "array", "items": {"type": "string", "maxLength": MAX_STORAGE_URL},
            "maxItems": MAX_STUDY_STORAGES, "description": "Every storage the tuning study "
            "was opened in (the newest last; spec.tuning.storage, or this namespace's "
            "default storage where it is absent; never a password): a deleted "
            "LLMDeployment's study is deleted from each that the operator's storage "
            "policy allows."},
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
        "correctionFactors": {"type": "object", "additionalProperties": {"type": "number"},
                              "description": "What the correction learned: per cost-model "
                              "feature, the factor on the profile's coefficient (empty "
                              "while the twin runs uncorrected)."},
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


def _value_type(default: Any) -> dict[str, Any]:
    """A knob's JSON type, from its default (no range: the engine's config judges it)."""
    if isinstance(default, enum.Enum | str):
        return {"type": "string"}
    if isinstance(default, bool):
        return {"type": "boolean"}
    return {"type": "integer" if isinstance(default, int) else "number"}


def _knobs(desc: str) -> dict[str, Any]:
    """A config as ``EngineConfig.to_dict`` writes it (or some of it): each knob by its
    field name."""
    return _obj({f.name: _value_type(f.default) for f in dataclasses.fields(EngineConfig)},
                desc=desc)


def _config_schema() -> dict[str, Any]:
    """``status.config``: the live knobs as ``reconcile.config_status`` writes them."""
    top: dict[str, Any] = {}
    preemption: dict[str, Any] = {}
    for path, name in KNOB_PATHS.items():
        (preemption if path[0] == "preemption" else top)[path[-1]] = \
            _value_type(engine_field(name).default)
    return _obj({**top, "preemption": _obj(preemption)}, desc="Live engine knobs.")


def _situation_schema() -> dict[str, Any]:
    """``backoff.situation``: what a verdict or a breach was reached under."""
    number = {"type": "number"}
    load = _obj({"rate": number, "prompt": number, "output": number, "requests": number,
                 "mix": {"type": "array", "items": number}, "digest": {"type": "string"}})
    return _obj({"replicas": {"type": "integer"}, "config": _knobs(""),
                 "settings": {"type": "string"}, "space": {"type": "string"},
                 "load": load})


def _backoff_schema() -> dict[str, Any]:
    """``backoff.Backoff.to_dict``: its verdict's situation (``backoff.situation``)."""
    number = {"type": "number"}
    return _obj({"situation": _situation_schema(), "until": number, "wait_s": number})


def _given_up_breach_schema() -> dict[str, Any]:
    """``given_up.breached``: the largest count that breached, and its situation."""
    return _obj({"replicas": {"type": "integer"}, "situation": _situation_schema()})


def _missed_trials_schema() -> dict[str, Any]:
    """``missed_trials.add``: the cut episodes' measured misses, and their situation."""
    return _obj({"trials": {"type": "integer"}, "situation": _situation_schema()})


# The free-form (dict) fields of the loop state and what the controller writes in each.
_DICT_FIELDS = {"baseline_config": lambda: _knobs(""), "best_config": lambda: _knobs(""),
                "config": lambda: _knobs(""), "revert_to": lambda: _knobs(""),
                "twin": _twin_schema,
                "backoff": _backoff_schema, "given_up_breach": _given_up_breach_schema,
                "missed_trials": _missed_trials_schema}


def _fields_schema(cls: type, desc: str = "") -> dict[str, Any]:
    """A dataclass as its ``asdict`` writes it, each field typed by its annotation."""
    hints = typing.get_type_hints(cls)
    return _obj({f.name: _hinted(hints[f.name], f.name) for f in dataclasses.fields(cls)},
                desc=desc or None)


def _hinted(hint: Any, name: str) -> dict[str, Any]:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        (hint,) = [h for h in typing.get_args(hint) if h is not type(None)]
        return {**_hinted(hint, name), "nullable": True}
    origin = typing.get_origin(hint)
    if origin is list:
        (item,) = typing.get_args(hint)
        return {"type": "array", "items": _hinted(item, name)}
    if origin is dict:
        if name not in _DICT_FIELDS:
            raise TypeError(f"loop state field {name}: a free-form map; give its status "
                            "schema in crd_status._DICT_FIELDS (what the controller writes "
                            "there, typed down to its values)")
        return _DICT_FIELDS[name]()
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _fields_schema(hint)
    if isinstance(hint, type) and issubclass(hint, enum.Enum | str):
        return {"type": "string"}
    types_ = {bool: "boolean", int: "integer", float: "number"}
    if hint not in types_:
        raise TypeError(f"loop state field {name}: no status schema for {hint!r}; map "
                        "its type in crd_status._hinted")
    return {"type": types_[hint]}
