"""Studies whose LLMDeployment is gone, reclaimed when the operator starts.

A CR's study is deleted as the CR goes (study_cleanup.py), before the operator's
finalizer lets it go. A CR whose finalizer was released without the operator
(``slopilot operator uninstall`` with no operator running and the storage out of its
reach, or a hand-made patch), or whose storage was down as it went, leaves its study
behind: a leak in a storage other tenants share, not lost data (no later CR resumes it).

Each study's name holds its CR's namespace, name and uid (``daemon.study_name``). At
start the operator lists the studies in each storage it can list (the administrator's
allow-list entries that name one database: not ``*``, nor a ``sqlite:////dir/*``
directory, whose files it never opens unasked), and deletes each whose namespace it
serves and whose uid no LLMDeployment in that namespace has now. Keyed by uid, never by
name: a CR made again under a deleted one's name, in its namespace or another, has a uid
of its own, and its study is kept. The studies are listed before the CRs, so a study
found belongs to a CR made before that listing, which the listing shows while it lives. A
namespace whose CRs cannot be listed keeps every study (nothing is deleted on a guess),
and so does a name not shaped as the operator's (``slopilot tune``'s own studies).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

# kopf's matcher, not a copy: which namespaces it serves is its rule (pinned kopf).
from kopf._cogs.structs.references import NamespaceName, match_namespace

from slopilot.operator.crd import API_VERSION, PLURAL
from slopilot.operator.kubeapi import Kube
from slopilot.operator.policy import OperatorPolicy
from slopilot.operator.study_storage import ALLOW_ALL
from slopilot.operator.validation import DNS_1123_LABEL, DNS_1123_SUBDOMAIN
from slopilot.tuner.study.storage import StudyStorageError, delete_named_study, study_names
from slopilot.tuner.study.storage_url import shown

log = logging.getLogger(__name__)
UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
"""A Kubernetes uid (an RFC 4122 UUID, as the API server writes it)."""


@dataclass(frozen=True)
class StudyOwner:
    """The CR a study's name says it belongs to."""

    namespace: str
    name: str
    uid: str


def owner_of(study: str) -> StudyOwner | None:
    """The CR ``study`` (``namespace/name/uid``) was made for; None for a name the
    operator does not make."""
    parts = study.split("/")
    if len(parts) != 3:
        return None
    namespace, name, uid = parts
    if not (DNS_1123_LABEL.fullmatch(namespace) and DNS_1123_SUBDOMAIN.fullmatch(name)
            and UID.fullmatch(uid)):
        return None
    return StudyOwner(namespace, name, uid)


def listable_storages(policy: OperatorPolicy) -> list[str]:
    """The allow-list's entries that name one database (with their credentials)."""
    return [e for e in policy.allowed_storage if e != ALLOW_ALL and not e.endswith("/*")]


def serving(patterns: Sequence[str] | None) -> Callable[[str], bool]:
    """Whether the operator serves a namespace: every one (None: ``--all-namespaces``), or
    one its ``--namespace`` patterns match, by kopf's own rule (globs, comma-separated
    parts, ``!`` exclusions: ``team-*, !team-secret``), as its observer matches them."""
    if patterns is None:
        return lambda _namespace: True
    return lambda namespace: any(
        match_namespace(NamespaceName(namespace), p) for p in patterns)


def reclaim_orphaned_studies(kube: Kube, policy: OperatorPolicy,
                             served: Callable[[str], bool]) -> list[str]:
    """Delete every study of a gone CR from the listable storages (module docstring);
    the names deleted. A storage or a namespace that cannot be read is skipped, with a
    warning."""
    deleted: list[str] = []
    for url in listable_storages(policy):
        try:
            names = study_names(url)
        except StudyStorageError as exc:
            log.warning("orphaned studies not reclaimed from %s: %s", shown(url), exc)
            continue
        live: dict[str, set[str] | None] = {}
        for study in names:
            owner = owner_of(study)
            if owner is None or not served(owner.namespace):
                continue
            if owner.namespace not in live:
                live[owner.namespace] = _live_uids(kube, owner.namespace)
            uids = live[owner.namespace]
            if uids is None or owner.uid in uids:
                continue
            try:
                gone = delete_named_study(url, study)
            except StudyStorageError as exc:
                log.warning("orphaned study %s stays in %s: %s", study, shown(url), exc)
                continue
            if gone:
                log.info("orphaned study %s (its LLMDeployment is gone) deleted from %s",
                         study, shown(url))
                deleted.append(study)
    return deleted


def _live_uids(kube: Kube, namespace: str) -> set[str] | None:
    """The uids of the LLMDeployments in ``namespace``; None where they cannot be read."""
    try:
        items: list[dict[str, Any]] = kube.list(API_VERSION, PLURAL, namespace)
    except Exception as exc:  # an API error, RBAC: nothing there is judged orphaned
        log.warning("orphaned studies of namespace %s not reclaimed: its LLMDeployments "
                    "could not be listed: %s: %s", namespace, type(exc).__name__, exc)
        return None
    return {str((item.get("metadata") or {}).get("uid")) for item in items}
