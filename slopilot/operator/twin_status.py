"""Which twin a deployment's controller runs, in its status, and when to read it again.

The daemon resolves the twin (``TwinTracker.resolve``: ``twin_profile.resolve_twin``,
again only for a new spec generation or ConfigMap version) whenever it builds the
controller; ``TwinTracker`` writes the answer (``status.twin.profile``, the ``TwinCalibrated``
condition, an event when it changes) and tells the daemon to rebuild when the profile's
ConfigMap was created, edited or deleted since (one GET every ``RECHECK_S``, only while
the spec names a profile): a recalibrated profile reaches the twin without a spec edit.

``status.twin`` has two writers: this one (``profile``) and the daemon's twin check (the
other fields, loop_status.status_after). A status write is a JSON merge patch, which
merges maps key by key, so each writes only its own keys and neither erases the other's;
a key of ours that went away is written as null, which the merge deletes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, cast

import kopf

from slopilot.operator.conditions import merge_conditions
from slopilot.operator.kubeapi import Kube
from slopilot.operator.merge_patch import replacing
from slopilot.operator.spec import LLMDeploymentSpec
from slopilot.operator.status_writer import write_status
from slopilot.operator.twin_profile import TwinChoice, config_map_version, resolve_twin

log = logging.getLogger(__name__)
RECHECK_S = 30.0
PROFILE_FIELDS = ("calibrated", "source", "runs")  # TwinChoice.status(), CRD status.twin


def profile_patch(twin: TwinChoice) -> dict[str, Any]:
    """``status.twin.profile`` as a merge patch: ``twin.status()``, a field it lacks null."""
    return {**dict.fromkeys(PROFILE_FIELDS), **twin.status()}


def check_patch(check: Mapping[str, Any], before: Any) -> dict[str, Any]:
    """``status.twin``'s check fields (``TwinCheck.to_dict``) as a merge patch over the
    ``status.twin`` the object holds: in each map of the check (``classes``,
    ``correctionFactors``) a key the status holds and the check lacks is set null, so a
    check that learned nothing, or measured no class, leaves none of an earlier one's.
    The status's own other fields (``profile``, the TwinTracker's) are left alone."""
    old = before if isinstance(before, Mapping) else {}
    return {k: replacing(v, old.get(k)) if isinstance(v, Mapping) else v
            for k, v in check.items()}


class TwinTracker:
    def __init__(self, kube: Kube, namespace: str, name: str, clock: Callable[[], float]
                 ) -> None:
        self.kube, self.namespace, self.name, self.clock = kube, namespace, name, clock
        self.current: TwinChoice | None = None
        self.checked = 0.0
        self.resolved: tuple[int | None, LLMDeploymentSpec, TwinChoice] | None = None
        """The last ``resolve`` answer, with the spec generation and spec it was for."""

    def resolve(self, spec: LLMDeploymentSpec, generation: int | None) -> TwinChoice:
        """``resolve_twin``'s answer for ``spec`` (of ``generation``), read again only
        for another generation or once its ConfigMap's resourceVersion moved. A
        controller that cannot be built is built again at every tick, and each build
        resolved its twin: up to ``MAX_PROFILE_BYTES`` of the tenant's YAML, most of a
        second of the operator's CPU (under the GIL its handlers share), parsed every
        few seconds for as long as the build failed."""
        last = self.resolved
        if last is not None and last[0] == generation and last[2].ref == spec.twin.profile \
                and (last[2].ref is None or config_map_version(
                    self.kube, self.namespace, last[2].ref) == last[2].version):
            return last[2]
        twin = resolve_twin(self.kube, self.namespace, spec)
        self.resolved = (generation, spec, twin)
        return twin

    def moved(self) -> bool:
        """Whether the profile's ConfigMap changed since it was read (see the docstring)
        so that the twin is another: read again, the same answer (a refusal in the same
        words, the same profile) is kept, with the new version, and rebuilds nothing.
        A rebuild at every edit told the CR's author, who may not read the ConfigMap, when
        one that is no profile of theirs came into being and each time it was edited."""
        twin = self.current
        # Negative after the clock stepped back: looked at now, not after the step's length.
        if twin is None or twin.ref is None or 0 <= self.clock() - self.checked < RECHECK_S:
            return False
        self.checked = self.clock()
        if config_map_version(self.kube, self.namespace, twin.ref) == twin.version:
            return False
        last = self.resolved
        if last is None or last[2].ref != twin.ref:
            return True
        fresh = resolve_twin(self.kube, self.namespace, last[1])
        self.resolved = (last[0], last[1], fresh)  # what resolve() answers next
        if (fresh.profile, fresh.problem, fresh.source) == \
                (twin.profile, twin.problem, twin.source):
            self.current = fresh
            return False
        return True

    def write(self, twin: TwinChoice, generation: int | None,
              ours: Callable[[Mapping[str, Any]], bool]) -> None:
        """Say which twin runs; an event only when that changed (not at every rebuild)."""
        before = self.current
        changed = before is None or before.status() != twin.status() or \
            before.problem != twin.problem
        self.current, self.checked = twin, self.clock()
        try:
            written = write_status(self.kube, self.namespace, self.name, lambda fresh: {
                "twin": {"profile": profile_patch(twin)}, "conditions": merge_conditions(
                    (fresh.get("status") or {}).get("conditions"),
                    [twin.condition(generation)])} if ours(fresh) else None)
        except Exception:  # an API error: the next rebuild writes it again
            log.exception("%s/%s: could not write which twin runs", self.namespace, self.name)
            return
        if written is None or not changed:
            return
        target = cast("kopf.Body", written)
        if twin.problem is not None:
            kopf.warn(target, reason="TwinProfileRefused",
                      message=twin.condition(generation)["message"])
        elif twin.calibrated:
            kopf.info(target, reason="TwinProfileLoaded", message=twin.describe())
