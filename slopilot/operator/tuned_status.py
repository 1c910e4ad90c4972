"""``TunedStatus``: the config every replica runs, recorded in the CR's
``status.tunedConfig``.

Every config applied to all replicas is recorded in ``status.tunedConfig`` (with a hash
of the spec it was tuned from) and rendered into the owned objects, so a restarted pod
starts with it and a later reconcile keeps it instead of reverting to the spec. A trial's
on every replica (vLLM's, or a built-in one's with one replica or canaries off) is
recorded as a trial's (``knobs.tuned_record``), only while the daemon's own loop state is
on record (``holds``), and ``sync_config`` (but during a canary trial) puts the committed
config back where no trial is on record, or the running trial's where another's is
recorded, before it sends the pods theirs. ``committed_config``, what the loop begins an
episode on, reads the committed record alone, never a trial's.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any

from slopilot.operator.crd import API_VERSION, PLURAL
from slopilot.operator.engine_deployment import vllm_max_num_seqs
from slopilot.operator.knobs import (
    committed_body,
    committed_overlay,
    trial_recorded,
    tuned_overlay,
    tuned_record,
)
from slopilot.operator.kubeapi import ApiError, Kube
from slopilot.operator.merge_patch import replacing
from slopilot.operator.pod_admin import ApplyError
from slopilot.operator.policy import OperatorPolicy
from slopilot.operator.reconcile import reconcile
from slopilot.operator.spec import Backend, parse_spec
from slopilot.operator.status_writer import ATTEMPTS
from slopilot.operator.tokens import TokenMint

log = logging.getLogger(__name__)


class NotHeld(ApplyError):
    """Another writer's loop state is on record: the config was not recorded."""


Holds = Callable[[Mapping[str, Any]], bool]
"""The CR as it is now in, whether the writer still holds the state on record there."""


class TunedStatus:
    """``status.tunedConfig`` of LLMDeployment ``namespace/name`` (module docstring)."""

    def __init__(self, kube: Kube, namespace: str, name: str, *, mint: TokenMint,
                 policy: OperatorPolicy,
                 guard: Callable[[], AbstractContextManager[Any]],
                 body: Callable[[], dict[str, Any]]) -> None:
        self.kube, self.namespace, self.name = kube, namespace, name
        self.mint, self.policy, self.guard = mint, policy, guard
        self.body = body
        """The CR, fresh (the handle's read: ApplyError once it is gone)."""

    def sync(self, body: Mapping[str, Any], backend: Backend,
             trial: Mapping[str, Any] | None, holds: Holds | None) -> bool:
        """Put in ``status.tunedConfig`` the config every replica is to run; whether it
        was written. vLLM runs it (its knobs are arguments, rendered from it), and so
        does a built-in pod (the ConfigMap's at start, the spec's at each sync): where
        it is a trial's config and no trial is on record (its daemon was overtaken by
        another's, or the state reset), the committed config goes back; where another
        trial is on record than the one recorded, that trial's config goes on. Never
        called for a built-in canary trial, which is not recorded. Written only while
        ``holds`` says the state judged is still on record."""
        if trial is None:
            if not trial_recorded(body):
                return False
            log.warning("%s: a trial's config is recorded but no trial is on record: the "
                        "committed config goes back", self.name)
            self.record(body, tuned_record(body, committed_overlay(body), trial=False),
                        holds=holds)
            return True
        # The trial's knobs over the committed config, as apply_config recorded them.
        builtin = backend is Backend.BUILTIN
        new = parse_spec(committed_body(body)).engine.with_overrides(trial,
                                                                     live_only=builtin)
        if not builtin:
            new = dataclasses.replace(new, max_num_seqs=vllm_max_num_seqs(new))
        engine = new.to_dict()
        if tuned_overlay(body) == engine:
            return False
        log.warning("%s: the recorded config is not the running trial's: the trial's goes "
                    "on", self.name)
        self.record(body, tuned_record(body, engine, trial=True), holds=holds)
        return True

    def record(self, body: Mapping[str, Any], tuned: dict[str, Any] | None, *,
               holds: Holds | None = None) -> None:
        """Persist the config every replica runs (``tuned``: ``status.tunedConfig``, as
        judged from ``body``; None: none), then render it (ConfigMap, vLLM args). With ``holds``,
        only while the writer still holds the loop state on record, and conditional on
        the version judged: a second daemon's trial (before the peering paused it) was
        rendered over the first's, and measured as the first's."""
        uid = body["metadata"].get("uid")
        with self.guard():
            updated = self._write(uid, tuned, holds)
            outcome = reconcile(self.kube, updated, policy=self.policy, mint=self.mint)
        if not outcome.valid:
            raise ApplyError(f"{self.name}: the spec became invalid: {outcome.problems}")

    def _write(self, uid: Any, tuned: dict[str, Any] | None,
               holds: Holds | None) -> dict[str, Any]:
        """``status.tunedConfig`` replaced whole by ``tuned`` (a committed record drops a
        trial's keys). The uid is a precondition: the
        pods' PUTs take a while, and a CR deleted and re-created under the name meanwhile
        took this one's tuned config (its ConfigMap rendered from it) when it was written
        by name. With ``holds``, the resourceVersion read is one too."""
        for _ in range(ATTEMPTS):
            fresh = self.body()
            if holds is not None and not holds(fresh):
                raise NotHeld(
                    f"LLMDeployment {self.namespace}/{self.name}: another writer's loop "
                    "state is on record in status.controller (another operator replica's "
                    "daemon): this config is not recorded, and the state on record is "
                    "resumed")
            old = (fresh.get("status") or {}).get("tunedConfig")
            meta: dict[str, Any] = {"uid": uid}
            if holds is not None:
                meta["resourceVersion"] = fresh["metadata"]["resourceVersion"]
            patch = {"metadata": meta, "status": {
                "tunedConfig": None if tuned is None else replacing(tuned, old)}}
            try:
                return self.kube.patch(API_VERSION, PLURAL, self.namespace, self.name,
                                       patch, subresource="status")
            except ApiError as exc:
                if exc.status == 409 and holds is not None and \
                        str(self.body()["metadata"].get("uid")) == str(uid):
                    continue  # a concurrent write moved the version: judged again
                if exc.status not in (404, 409):
                    raise
                raise ApplyError(f"LLMDeployment {self.namespace}/{self.name} (uid {uid}) "
                                 "is gone: its config was not recorded") from None
        raise ApplyError(f"LLMDeployment {self.namespace}/{self.name}: {ATTEMPTS} writes of "
                         "its config in a row met a concurrent write; not recorded")
