"""``slopilot operator uninstall``: delete every LLMDeployment, and let none stay Terminating.

Every LLMDeployment carries the operator's finalizer (kopf puts one on every object its
daemons and timers serve, and holds it until they have stopped): the operator fails the
running trial and deletes the CR's study before it lets the CR go. Deleted with no
operator running (``kubectl delete -k manifests/`` takes the operator, its RBAC and the
CRD at once), every CR, the CRD and each namespace holding one stayed Terminating until
someone stripped the finalizer by hand, and the studies stayed in their storage.

This command deletes the CRs first and gives the operator ``timeout_s`` to end them as it
always does. A CR still there after that (no operator runs, or it cannot reach the CR)
is ended here: its study is deleted from every storage on record that this process's
policy allows (the operator's own environment when run in its pod; elsewhere the
default), then the operator's finalizer, and only it, is released, conditional on the
version read. A study that could not be deleted stays, named in the report, and the
operator reclaims it at its next start (study_reclaim.py). The owned objects need nothing:
each carries the CR's controller reference, and Kubernetes' garbage collector deletes
them with it.

Before it changes anything the command asks the API server whether the caller may do
all of it (uninstall_access.py), and stops naming what is missing. A call refused
after all (an admission webhook, an overloaded server, a binding removed meanwhile) is
reported for its CR, with what it left: a CR not deleted is left whole (never ended here:
it still serves), one not released stays Terminating. Each step is idempotent (a CR
already Terminating is not deleted again, a study already gone is no error, a finalizer
already released is none to release), so running the command again finishes the job.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from slopilot.operator.crd import API_VERSION, PLURAL
from slopilot.operator.daemon import study_name
from slopilot.operator.kubeapi import ApiError, Kube, resource_path
from slopilot.operator.policy import OperatorPolicy
from slopilot.operator.settings import FINALIZER
from slopilot.operator.study_cleanup import storages_to_clean
from slopilot.operator.uninstall_access import UninstallRefused, missing, needed
from slopilot.tuner.study.storage import StudyStorageError
from slopilot.tuner.study.storage_url import shown
from slopilot.tuner.study.study_family import delete_family

__all__ = ["UninstallRefused", "Uninstalled", "uninstall"]
log = logging.getLogger(__name__)
POLL_S = 2.0
"""How often the CRs are looked at while the operator ends them."""
RELEASE_ATTEMPTS = 8


@dataclass
class Uninstalled:
    """What one uninstall did, CR by CR (``namespace/name``)."""

    ended_by_operator: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    """CRs ended here: their studies deleted where reachable, the finalizer released."""
    studies_left: list[str] = field(default_factory=list)
    """``study in storage: why`` for each study that could not be deleted."""
    stuck: list[str] = field(default_factory=list)
    """``namespace/name: why``: CRs left Terminating, the operator's finalizer on."""
    not_deleted: list[str] = field(default_factory=list)
    """``namespace/name: why``: CRs whose deletion the API refused, left as they were."""


def _key(body: dict[str, Any]) -> str:
    return f"{body['metadata']['namespace']}/{body['metadata']['name']}"


def _listed(kube: Kube, namespaces: Sequence[str] | None) -> list[dict[str, Any]]:
    """The CRs in scope, once the API server has said the caller may do all it takes
    to end them (else UninstallRefused, naming what is missing, before any change)."""
    if namespaces is not None:
        if gaps := missing(kube, needed(namespaces)):
            raise UninstallRefused(gaps)
        return [item for ns in dict.fromkeys(namespaces)
                for item in kube.list(API_VERSION, PLURAL, ns)]
    if gaps := missing(kube, needed(None)):
        raise UninstallRefused(gaps, all_namespaces=True)
    items = kube.list(API_VERSION, PLURAL, None)
    holding = {str(item["metadata"]["namespace"]) for item in items}
    if gaps := missing(kube, needed(None, holding)):
        raise UninstallRefused(gaps, all_namespaces=True)
    return items


def uninstall(kube: Kube, policy: OperatorPolicy, *, namespaces: Sequence[str] | None,
              timeout_s: float, clock: Callable[[], float] = time.monotonic,
              sleep: Callable[[float], None] = time.sleep) -> Uninstalled:
    """Delete the LLMDeployments of ``namespaces`` (None: every namespace), wait up to
    ``timeout_s`` for the operator to end them, then end the rest here (module
    docstring). UninstallRefused, with nothing changed, where the caller may not."""
    done = Uninstalled()
    targets = {str(b["metadata"]["uid"]): b for b in _listed(kube, namespaces)}
    for uid, body in list(targets.items()):
        meta = body["metadata"]
        if meta.get("deletionTimestamp"):
            continue
        try:
            kube.request("DELETE", resource_path(API_VERSION, PLURAL, meta["namespace"],
                                                 meta["name"]),
                         body={"preconditions": {"uid": uid}})
        except ApiError as exc:
            if exc.status not in (404, 409):  # gone, or a successor of the name: not ours
                del targets[uid]
                done.not_deleted.append(
                    f"{_key(body)}: not deleted: {exc}; left as it was (its finalizer, "
                    "its study and its objects), for the command run again")
    ends = clock() + timeout_s
    while True:
        left = _still_there(kube, targets)
        for uid in set(targets) - set(left):
            done.ended_by_operator.append(_key(targets[uid]))
        targets = left
        if not targets or clock() >= ends:
            break
        sleep(POLL_S)
    for body in targets.values():
        _end_here(kube, policy, body, done)
    done.ended_by_operator.sort()
    return done


def _still_there(kube: Kube, targets: dict[str, dict[str, Any]]
                 ) -> dict[str, dict[str, Any]]:
    """The targets that still exist (the same uid), as they are now; one that cannot be
    read now is kept as last read."""
    out = {}
    for uid, body in targets.items():
        try:
            now = kube.get(API_VERSION, PLURAL, body["metadata"]["namespace"],
                           body["metadata"]["name"])
        except ApiError as exc:
            log.warning("%s: not read (%s); taken as still there", _key(body), exc)
            out[uid] = body
            continue
        if now is not None and str(now["metadata"].get("uid")) == uid:
            out[uid] = now
    return out


def _end_here(kube: Kube, policy: OperatorPolicy, body: dict[str, Any],
              done: Uninstalled) -> None:
    """What the operator's end of a deleted CR does, without the operator: its study
    deleted from each storage on record, then the operator's finalizer released."""
    meta = body["metadata"]
    key = _key(body)
    if not meta.get("deletionTimestamp"):  # deleted by nobody: it still serves
        done.not_deleted.append(f"{key}: not Terminating after its deletion; left as it "
                                "was, for the command run again")
        return
    if FINALIZER in (meta.get("finalizers") or ()):
        name = _study(body)
        for url in storages_to_clean(body, policy, log):
            try:
                delete_family(url, name)  # its base study and any successor
            except StudyStorageError as exc:
                done.studies_left.append(f"{name} in {shown(url)}: {exc}")
    why = _release(kube, body)
    if why is None:
        done.released.append(key)
    else:
        done.stuck.append(f"{key}: the finalizer {FINALIZER} was not released: {why}; "
                          "left Terminating (its study gone, but where named above), for "
                          "the command run again")


def _study(body: dict[str, Any]) -> str:
    meta = body["metadata"]
    return study_name(meta["namespace"], meta["name"], str(meta["uid"]))


def _release(kube: Kube, body: dict[str, Any]) -> str | None:
    """Drop the operator's finalizer (others stay: they are other controllers' to
    release), conditional on the version read; None once this CR holds none of ours,
    else why not."""
    meta = body["metadata"]
    for _ in range(RELEASE_ATTEMPTS):
        finalizers = list(meta.get("finalizers") or ())
        if FINALIZER not in finalizers:
            return None
        patch = {"metadata": {"uid": meta["uid"], "resourceVersion": meta["resourceVersion"],
                              "finalizers": [f for f in finalizers if f != FINALIZER]}}
        try:
            kube.patch(API_VERSION, PLURAL, meta["namespace"], meta["name"], patch)
            return None
        except ApiError as exc:
            if exc.status == 404:
                return None
            if exc.status != 409:
                log.warning("%s: the finalizer %s was not released: %s", _key(body),
                            FINALIZER, exc)
                return str(exc)
        try:
            fresh = kube.get(API_VERSION, PLURAL, meta["namespace"], meta["name"])
        except ApiError as exc:
            return f"the CR could not be read again after a conflict: {exc}"
        if fresh is None or str(fresh["metadata"].get("uid")) != str(meta["uid"]):
            return None  # gone (the operator ended it meanwhile)
        meta = fresh["metadata"]
    return f"{RELEASE_ATTEMPTS} conflicting writes in a row (another writer is busy on it)"
