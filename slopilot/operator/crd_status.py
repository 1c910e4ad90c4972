"""The LLMDeployment's status schema: what the operator and its controller write."""

from __future__ import annotations

from typing import Any

from slopilot.operator.crd_types import integer as _int
from slopilot.operator.crd_types import obj as _obj
from slopilot.operator.crd_types import preserve as _preserve
from slopilot.operator.crd_types import string as _str
from slopilot.operator.knobs import MAX_STORAGE_URL
from slopilot.operator.spec import PHASES
from slopilot.operator.study_storage import MAX_STUDY_STORAGES


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
        "controller": _preserve(_obj({}, desc="The controller's persisted loop state: a "
                                     "restarted operator resumes it instead of acting twice.")),
        "tunedConfig": _preserve(_obj({}, desc="Knobs committed by the tuner (engine) and a "
                                      "hash of the spec they were tuned from (base); "
                                      "during a trial on every replica, the trial's "
                                      "knobs (trial: true) beside the committed ones "
                                      "(committed).")),
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
