"""Every storage an LLMDeployment's study has lived in, and its deletion from each.

``spec.tuning.storage`` may change (from one allowed storage to another): the daemon then
opens the study afresh in the new one, and the old one keeps the study's trials. Deleting
only from the storage the spec names at deletion left the old one behind, trials and all,
in a storage other tenants share. So the daemon records each storage in
``status.studyStorages`` as it opens the study there (``with_storage``), and a deleted
CR's study is deleted from each (``delete_studies``): by the daemon's end while tuning is
on, and by the deletion handler after it (a no-op then), or where no daemon ran (tuning
off, or the CR deleted while no operator ran).

The status is whoever may write it, not only the operator: each entry read back is judged
by the administrator's storage policy again (``resolve_storage``, for the CR's namespace:
``{namespace}`` in an entry is its) and skipped where it refuses, so no entry makes the
operator open a storage it would not open for the spec.
Only this CR's studies (their names hold the CR's uid: its base study and the successors
a changed search space moved it to, ``study_family.py``) are deleted from any of them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from slopilot.operator.daemon import study_name
from slopilot.operator.policy import OperatorPolicy
from slopilot.operator.study_storage import MAX_STUDY_STORAGES, StorageRefused, resolve_storage
from slopilot.tuner.study.storage import StudyStorageError
from slopilot.tuner.study.storage_url import shown
from slopilot.tuner.study.study_family import delete_family


def recorded_storages(status: Mapping[str, Any] | None) -> list[str]:
    """``status.studyStorages`` as far as it is a list of strings (anything else in it
    was not written by the operator, and names no storage)."""
    entries = (status or {}).get("studyStorages")
    if not isinstance(entries, list):
        return []
    return [e for e in entries if isinstance(e, str)][-MAX_STUDY_STORAGES:]


def with_storage(status: Mapping[str, Any] | None, storage: str) -> list[str]:
    """``status.studyStorages`` with ``storage`` (the storage the CR names,
    ``OperatorPolicy.named_storage``: never a password) on it, the newest last."""
    kept = [e for e in recorded_storages(status) if e != storage]
    return [*kept, storage][-MAX_STUDY_STORAGES:]


def storages_to_clean(body: Mapping[str, Any], policy: OperatorPolicy,
                      log: logging.Logger | logging.LoggerAdapter[Any]) -> list[str]:
    """The storages (the policy's URLs, with credentials) the deleted CR's study may be
    in: each on record that the policy allows a CR of its namespace, once."""
    out: list[str] = []
    namespace = body["metadata"]["namespace"]
    for entry in recorded_storages(body.get("status")):
        try:
            url = resolve_storage(entry, policy.storage_rules, namespace)
        except StorageRefused as exc:
            log.warning("status.studyStorages: %s; its study, if any, is not deleted", exc)
            continue
        if url not in out:
            out.append(url)
    return out


def delete_studies(body: Mapping[str, Any], policy: OperatorPolicy, *,
                   log: logging.Logger | logging.LoggerAdapter[Any]) -> None:
    """Delete the CR's studies (its base study and the successors a changed search space
    moved it to: ``study_family.py``) from every storage on record. A storage that fails
    keeps them (a log line says so, as operations.md tells how to remove them by hand)."""
    meta = body["metadata"]
    name = study_name(meta["namespace"], meta["name"], str(meta.get("uid") or ""))
    for url in storages_to_clean(body, policy, log):
        try:
            gone = delete_family(url, name)
        except StudyStorageError as exc:
            log.warning("study %s stays in %s: %s", name, shown(url), exc)
            continue
        for study in gone:  # none: the daemon's end deleted them, or none was made there
            log.info("study %s deleted from %s", study, shown(url))
