"""Status conditions (Kubernetes' metav1.Condition shape) merged by type.

Two writers share ``status.conditions``: the reconcile handler (Valid, Reconciled,
KnobsIgnored, AdminToken, DisruptionBudget; its drift repairs Reconciled alone,
drift.py) and the controller daemon (Tuning, TwinCalibrated, ScrapeInterval: scrape_status.py);
PodsConfigured is the pods' sync's, which the handler runs while tuning is off and the
daemon while it is on (pods_status.py). Each
merges its own types into the list it just read, so neither drops the other's;
``lastTransitionTime`` moves only when a condition's status changes, as kubectl and
dashboards expect.
"""

from __future__ import annotations

import datetime
import enum
from collections.abc import Iterable, Mapping
from typing import Any


class ConditionType(enum.StrEnum):
    VALID = "Valid"
    RECONCILED = "Reconciled"
    KNOBS_IGNORED = "KnobsIgnored"
    ADMIN_TOKEN = "AdminToken"
    TUNING = "Tuning"
    TWIN_CALIBRATED = "TwinCalibrated"
    PODS_CONFIGURED = "PodsConfigured"
    SCRAPE_INTERVAL = "ScrapeInterval"
    DISRUPTION_BUDGET = "DisruptionBudget"  # False only: another's budget of the name


class DriftReason(enum.StrEnum):
    """The Reconciled condition's reasons a drift repair writes (drift.py)."""

    REPAIRED = "DriftRepaired"  # True: the message says what was put back, and when
    NOT_REPAIRED = "DriftNotRepaired"  # False: which object, and why; tried again


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(type_: ConditionType, status: bool | None, reason: str, message: str,
              generation: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": type_.value,
                           "status": "Unknown" if status is None else str(status),
                           "reason": reason, "message": message}
    if generation is not None:
        out["observedGeneration"] = generation
    return out


def merge_conditions(current: Iterable[Mapping[str, Any]] | None,
                     updates: Iterable[Mapping[str, Any]],
                     remove: Iterable[ConditionType] = ()) -> list[dict[str, Any]]:
    """``current`` with ``updates`` replacing same-type entries and ``remove`` types dropped."""
    gone = {t.value for t in remove}
    merged = {c["type"]: dict(c) for c in current or () if c.get("type") not in gone}
    for new in updates:
        old = merged.get(new["type"])
        entry = dict(new)
        same = old is not None and old.get("status") == new["status"]
        entry["lastTransitionTime"] = (old or {}).get("lastTransitionTime") if same \
            else now_rfc3339()
        if entry["lastTransitionTime"] is None:
            entry["lastTransitionTime"] = now_rfc3339()
        merged[new["type"]] = entry
    return list(merged.values())

