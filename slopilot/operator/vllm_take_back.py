"""A trial's knobs taken off a vLLM Deployment, from the operator's own record.

vLLM's knobs are its engine container's arguments, rendered from ``status.tunedConfig``,
where a trial on every replica is recorded as a trial's (``knobs.tuned_record``). Where
the operator ends a trial with no controller's verdict and cannot record the committed
config in its place, the trial's arguments stayed on every replica until the next
accepted rollout: under a spec the reconcile refuses (it renders nothing), and under a
status that takes no write (``deployment_loop.STATUS_GIVE_UP_S``), whose trial record
each reconcile rendered again. So ``take_back``:

- patches the Deployment's engine arguments for the tuned knobs to the episode's config,
  which the operator kept (the loop state's, from a spec it accepted). Every other
  argument and the rest of the template stay as the last accepted reconcile rendered
  them: nothing of a refused spec is read. No patch where they are that config already
  (no rollout). The template's checksum follows, as the render computes it, so the next
  accepted render of the same config rolls nothing;
- stamps the Deployment (``TAKEN_BACK_ANNOTATION``) with a seal of the status it was
  taken back under (``status.tunedConfig``, the trial's record, and
  ``status.controller``) and of the CR's uid, keyed by the operator's secret
  (``TokenMint.seal``, tokens.py). While the CR's status is still that one, the
  reconcile renders the record's committed config in place of the trial's
  (``rendered_body``): a drift repair (any event of the Deployment asks one) or the spec
  fixed would otherwise have put the trial back from the record no one could write. A
  write of either since (the committed config recorded, the loop's next state) leaves
  the stamp inert.

The stamp is on a Deployment in the tenant's namespace, whose annotations anyone with
patch rights on it writes, and the status it covers is the tenant's to read: a bare
digest of it, anyone could compute, and a stamp forged mid-trial had a drift repair
roll the pods onto the committed config while the status still recorded the trial (the
trial's window measuring the wrong config, then a second rollout back). A seal no
tenant can make without the key; one that does not verify (forged, or the key replaced:
its Secret deleted and the operator restarted) is no stamp, and the reconcile renders
the status as recorded (what it did before any take-back, and after a status write),
unless the trial the loop state on record runs was told failed in its study already,
which no tenant writes (``trial_ends.failed_in_study``): a repair by an operator
restarted under a new key then renders the committed config too, not the trial's
arguments until its loop's first step takes them off again (a rollout each way). That
question is a read of the study, and the stamp is the tenant's to write: it is asked
only where the Deployment's arguments are not the record's already (a stamp forged
mid-trial, or left by an earlier trial's take-back, changes nothing there), and its
answer is kept (``failed_trials.py``: a yes for good, a no for a minute), so no tenant
has each reconcile read a database. A read past its deadline defers a handler's
reconcile (``RenderDeferred``: nothing applied, tried again) rather than render the
trial's arguments back, for at most ``failed_trials.UNANSWERED_DEFER_S``. A
stamp removed or edited while the status still takes no write is put back by the loop
at its next step (``DeploymentLoop._keep_taken_back``), with the trial's arguments taken
off again where a repair rendered them meanwhile.

The loop's memory of a take-back does not outlive its process, and a key rotated in the
same outage leaves the stamp unverified. A restarted loop therefore recognises a
take-back from what outlives it (``DeploymentLoop._recognise_taken_back``): the status
still recording a trial and the loop state it built from that status owing the
episode's config with no trial running, a restore owed (the trial told failed in its
study: ``trial_ends.end_told``) or a stamp on the Deployment (``stamp_found``: present,
verified or not). It takes the trial back again, under the key it holds now
(docs/operations.md). A stamp that is only present proves nothing (anyone writes it),
and is not what the take-back trusts: the loop state says the trial is over. Nor is
one needed: the study is told before the Deployment is patched (they are no one
write), so an operator that died between the two left no stamp, and the trial's
arguments stayed on the pods.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slopilot.engine.config import EngineConfig
from slopilot.operator.crd import KIND
from slopilot.operator.engine_deployment import (
    CHECKSUM_ANNOTATION,
    vllm_checksum,
    with_vllm_knobs,
)
from slopilot.operator.failed_trials import (
    FAILED_TRIALS,
    READ_DEADLINE_S,
    UNANSWERED_DEFER_S,
    FailedTrials,
)
from slopilot.operator.knobs import committed_body, trial_recorded
from slopilot.operator.kubeapi import ApiError, Kube
from slopilot.operator.ownership import controlled_by
from slopilot.operator.pod_admin import ApplyError
from slopilot.operator.policy import OperatorPolicy
from slopilot.operator.scale_stamp import record_digest
from slopilot.operator.spec import Backend, SpecError, parse_spec
from slopilot.operator.tokens import TokenMint

TAKEN_BACK_ANNOTATION = "slopilot.dev/taken-back"
ATTEMPTS = 4
"""Reads and conditional patches one take-back makes at most: the Deployment
controller's own status writes move the resourceVersion the patch is conditional on."""


SEAL_PURPOSE = "taken-back"
"""The purpose a stamp's seal is made for (``TokenMint.seal``): no other seal is one."""


def status_digest(status: Any) -> str:
    """A digest of the CR's ``status`` as read: its trial record and loop state."""
    status = status if isinstance(status, Mapping) else {}
    return record_digest({"tunedConfig": status.get("tunedConfig"),
                          "controller": status.get("controller")})


def _sealed_message(uid: str, status: Any) -> str:
    # The uid: a stamp left on a Deployment adopted by a re-created CR of the same name,
    # whose status may come to record the same trial, covers nothing of the new CR's.
    return f"{uid}\n{status_digest(status)}"


def stamp(mint: TokenMint, uid: str, status: Any) -> str:
    """The stamp for CR ``uid`` with ``status`` as read (module docstring)."""
    return mint.seal(SEAL_PURPOSE, _sealed_message(uid, status))


def stamped(mint: TokenMint, uid: str, status: Any, found: Any) -> bool:
    """Whether ``found``, as read off the Deployment, is the stamp for ``status``."""
    return mint.sealed(SEAL_PURPOSE, _sealed_message(uid, status), found)


def take_back(kube: Kube, namespace: str, name: str, uid: str,
              config: Mapping[str, Any], status: Any, mint: TokenMint) -> bool:
    """Put ``config`` (a whole engine config, the operator's record of the episode's)
    in the vLLM arguments of the Deployment this CR (``uid``) controls, stamped over
    ``status`` (the CR's, as read) where it records a trial's config; whether the
    arguments were changed (a rollout). ApplyError where there is no such Deployment,
    its arguments are not the operator's render, or the API refuses the patch."""
    engine = EngineConfig().with_overrides(config)
    tuned = status.get("tunedConfig") if isinstance(status, Mapping) else None
    seal = stamp(mint, uid, status) if isinstance(tuned, Mapping) \
        and tuned.get("trial") is True else None
    for _ in range(ATTEMPTS):
        dep = kube.get("apps/v1", "deployments", namespace, name)
        if dep is None or not controlled_by(dep, KIND, uid):
            raise ApplyError(f"{name}: no Deployment/{name} of this LLMDeployment to take "
                             "the trial's vLLM arguments off")
        meta, template = dep["metadata"], dep["spec"]["template"]
        containers = template["spec"]["containers"]
        engine_at = next((i for i, c in enumerate(containers) if c.get("name") == "engine"),
                         None)
        if engine_at is None:
            raise ApplyError(f"{name}: Deployment/{name} has no engine container")
        args = list(containers[engine_at].get("args") or [])
        try:
            new = with_vllm_knobs(args, engine)
        except ValueError as exc:
            raise ApplyError(f"{name}: Deployment/{name}'s engine container: {exc}; the "
                             "trial's arguments stay until the spec is accepted") from None
        found = (meta.get("annotations") or {}).get(TAKEN_BACK_ANNOTATION)
        if new == args and (seal is None or stamped(mint, uid, status, found)):
            return False
        patch: dict[str, Any] = {"metadata": {
            "uid": meta.get("uid"), "resourceVersion": meta.get("resourceVersion")}}
        if seal is not None:
            patch["metadata"]["annotations"] = {TAKEN_BACK_ANNOTATION: seal}
        if new != args:
            # A merge patch replaces a list whole: every container as it is, the engine's
            # arguments changed.
            sent = [dict(c, args=new) if i == engine_at else c
                    for i, c in enumerate(containers)]
            meter = next((c.get("command") or [] for c in containers
                          if c.get("name") == "meter"), [])
            patch["spec"] = {"template": {
                "metadata": {"annotations": {CHECKSUM_ANNOTATION: vllm_checksum(new, list(meter))}},
                "spec": {"containers": sent}}}
        try:
            kube.patch("apps/v1", "deployments", namespace, name, patch)
        except ApiError as exc:
            if exc.status == 409:
                continue  # the Deployment moved since the read: judged again
            raise ApplyError(f"{name}: the trial's vLLM arguments not taken off "
                             f"Deployment/{name}: {exc}") from None
        return new != args
    raise ApplyError(f"{name}: Deployment/{name} changed between each of {ATTEMPTS} reads "
                     "and its conditional patch: the trial's vLLM arguments are taken off "
                     "at the next try")


def stamp_found(kube: Kube, namespace: str, name: str, uid: str) -> bool:
    """Whether the Deployment CR ``uid`` controls carries a take-back stamp at all,
    verified or not (a key rotated since leaves it unverified): a take-back may have
    been made there by an operator since restarted (module docstring)."""
    dep = kube.get("apps/v1", "deployments", namespace, name)
    if dep is None or not controlled_by(dep, KIND, uid):
        return False
    return TAKEN_BACK_ANNOTATION in ((dep.get("metadata") or {}).get("annotations") or {})


class RenderDeferred(Exception):
    """The reconcile cannot tell yet what to render: whether the trial on record was told
    failed is not answered within its deadline (``failed_trials.py``). Nothing is
    applied; the caller tries again (a drift repair's timer, the spec handler's retry)."""


def rendered_body(kube: Kube, body: Mapping[str, Any], mint: TokenMint,
                  policy: OperatorPolicy, answers: FailedTrials | None = None, *,
                  defer_unanswered: bool = False) -> Mapping[str, Any]:
    """``body`` as the reconcile renders it: where its ``status.tunedConfig`` records a
    trial whose arguments the operator took off the Deployment under this very status
    (its stamp, verified with ``mint``'s key), with that record reduced to its committed
    config (module docstring). A stamp that is present but does not verify (a key
    rotated since, or a tenant's) counts only where the trial's study, which no tenant
    writes, has it failed (``trial_ends.failed_in_study``, read in ``policy``'s
    storage): else an operator restarted under a new key rolled the trial's arguments
    back onto the pods at its first repair, until its loop's first step took them off
    again (two rollouts). The study is asked only where the Deployment's arguments are
    not the record's already (a stamp on pods that run the trial changes nothing: a
    tenant's, or one left by an earlier trial), and through ``answers`` (the process's,
    ``failed_trials.FAILED_TRIALS``, by default): a yes kept, a no kept for a minute. A
    read that does not answer within its deadline is not known: with
    ``defer_unanswered`` (the kopf handlers' reconciles) RenderDeferred, nothing
    applied until it answers or its bound passes (``failed_trials.UNANSWERED_DEFER_S``,
    a no then); without it (the loop's own writes, which render what they just
    recorded) counted as no."""
    if not trial_recorded(body):
        return body
    meta = body["metadata"]
    dep = kube.get("apps/v1", "deployments", meta["namespace"], meta["name"])
    if dep is None or not controlled_by(dep, KIND, str(meta.get("uid"))):
        return body
    found = ((dep.get("metadata") or {}).get("annotations") or {}).get(
        TAKEN_BACK_ANNOTATION)
    if found is None:
        return body
    if not stamped(mint, str(meta.get("uid")), body.get("status"), found):
        if _runs_record(dep, body):
            return body  # rendered as recorded, nothing rolls: no question to ask
        # Here, not at the top: trial_ends -> daemon -> kube_handle imports this module.
        from slopilot.operator.trial_ends import failed_in_study, trial_on_record
        trial = trial_on_record(body, policy)
        if trial is None:
            return body
        asked = answers if answers is not None else FAILED_TRIALS
        failed = asked.failed(trial, lambda: failed_in_study(trial), storage=trial.storage)
        if failed is None and defer_unanswered:
            raise RenderDeferred(
                f"{meta['name']}: whether trial {trial.number} of study {trial.study!r} "
                "was told failed is not answered yet (its storage has not answered "
                f"within {READ_DEADLINE_S:g} s): Deployment/{meta['name']} is left as "
                "it is until it is, its arguments rendered as recorded after "
                f"{UNANSWERED_DEFER_S:g} s without an answer")
        if not failed:
            return body
    return committed_body(body)


def _runs_record(dep: Mapping[str, Any], body: Mapping[str, Any]) -> bool:
    """Whether the vLLM engine arguments of ``dep`` (the Deployment, as read) carry the
    knobs ``body`` renders already: a trial's arguments on the pods, not taken off. The
    record rendered then rolls nothing, and the stamp could only have the repair take
    them off before the loop's next step does (as where it left no stamp)."""
    try:
        spec = parse_spec(body)
    except SpecError:
        return False
    if spec.backend is not Backend.VLLM:
        return False
    template = (dep.get("spec") or {}).get("template") or {}
    containers = (template.get("spec") or {}).get("containers") or []
    engine = next((c for c in containers if c.get("name") == "engine"), None)
    args = list((engine or {}).get("args") or [])
    try:
        return with_vllm_knobs(args, spec.engine) == args
    except ValueError:  # not the operator's render: the reconcile renders them whole
        return False
