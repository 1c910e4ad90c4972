"""Another writer's owner references on the operator's objects are theirs to keep.

Argo CD, a backup tool or a tenant may add an owner reference of their own to an object
an LLMDeployment owns. The drift repair sent the object's rendered ``ownerReferences``
(the CR's alone) in a merge patch, which replaces a list whole: the other reference was
removed, silently, at every event. Where the OwnerReferencesPermissionEnforcement
admission plugin runs (OpenShift, hardened clusters), changing ownerReferences needs
``delete`` on the object, which the operator's least-privilege RBAC does not grant: the
patch was refused (403) at every try, and nothing else on that object was ever repaired
again. These tests run the real drift repair as the operator's ServiceAccount, held to
exactly the rules manifests/ grants it, with and without the plugin.
"""

# mypy: disable-error-code="index,union-attr"

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import kopf
import kubernetes.client
import pytest

from slopilot.operator import handlers
from slopilot.operator.cr_locks import LockTable
from slopilot.operator.crd import crd_manifest
from slopilot.operator.handlers import repair_drift, retry_drift_repair
from slopilot.operator.kubeapi import ApiError, Kube
from slopilot.operator.policy import OperatorPolicy
from slopilot.operator.reconcile import RETRY_NAME_TAKEN_S, Change, Refusal, reconcile
from slopilot.operator.render import DEFAULT_OPERATOR_NAMESPACE
from tests.operator.operator_support import NS, Cluster, drift_handler, llmd, operator_mint
from tests.operator.test_operator_rbac import ACCOUNT, TOKEN, USER, cluster_wide
from tests.support.kube_authz import granted_to
from tests.support.kube_server import RunningEmulator

SERVICE = ("v1", "services", "chat")
# Argo CD's Application, as it marks what it tracks: an owner, not the controller.
ARGO = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Application", "name": "team-apps",
        "uid": "6f1c1e5a-0000-4000-8000-00000000a860"}
DRIFT = {"spec": {"selector": {"slopilot.dev/llmdeployment": "other"}}}


@pytest.fixture
def admin(kube: RunningEmulator, kube_client: kubernetes.client.ApiClient) -> Cluster:
    """The tenants' and other controllers' view: unrestricted."""
    kube.install(crd_manifest(),
                 {"apiVersion": "v1", "kind": "Namespace",
                  "metadata": {"name": DEFAULT_OPERATOR_NAMESPACE}})
    return Cluster(kube_client)


@pytest.fixture
def operator_kube(kube: RunningEmulator, tmp_path: Path) -> Iterator[Kube]:
    """The operator's client: its ServiceAccount, held to the shipped cluster-wide RBAC."""
    kube.emulator.restrict(TOKEN, USER, granted_to(cluster_wide(), DEFAULT_OPERATOR_NAMESPACE,
                                                   ACCOUNT))
    with kubernetes.config.new_client_from_config(
            config_file=str(kube.kubeconfig_as(TOKEN, tmp_path / "sa.kubeconfig"))) as client:
        yield Kube(client)


def memo_of(admin: Cluster, kube: Kube) -> SimpleNamespace:
    return SimpleNamespace(kube=kube, locks=LockTable(), policy=OperatorPolicy(),
                           tokens=operator_mint(admin))


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """The events the handlers post: (reason, message)."""
    posted: list[tuple[str, str]] = []
    for name in ("info", "warn"):
        monkeypatch.setattr(kopf, name, lambda body, *, reason, message, **_:
                            posted.append((reason, message)))
    return posted


def refused(kube: RunningEmulator) -> list[str]:
    return [f"{c.verb} {c.resource}" for user, c in kube.emulator.refused if user == USER]


def refs_of(admin: Cluster, api: str, plural: str, name: str) -> list[dict[str, Any]]:
    return list(admin.owned(api, plural, name)["metadata"].get("ownerReferences") or [])


def made(admin: Cluster, memo: SimpleNamespace) -> dict[str, Any]:
    """The CR, its objects made by the operator's own reconcile."""
    body = admin.create(llmd())
    out = reconcile(memo.kube, body, policy=memo.policy, mint=memo.tokens)
    assert out.valid and set(out.changes.values()) == {Change.CREATED}, out
    return admin.get()


def drift_event(admin: Cluster, memo: SimpleNamespace, api: str, plural: str,
                name: str) -> None:
    """What kopf does at an event of the object: the drift handler, as the operator."""
    drift_handler(repair_drift, memo, event={"type": "MODIFIED"},
                  body=admin.owned(api, plural, name), logger=logging.getLogger(__name__))


def add_owner(admin: Cluster, api: str, plural: str, name: str, ref: dict[str, Any]) -> None:
    """Another writer appends its reference, keeping the operator's (as kopf.adopt or
    ``kubectl patch`` with the whole list would)."""
    refs = refs_of(admin, api, plural, name)
    admin.kube.patch(api, plural, NS, name, {"metadata": {"ownerReferences": [*refs, ref]}})


@pytest.mark.parametrize("plugin", [True, False], ids=["enforced", "plain"])
def test_a_foreign_owner_reference_is_kept_and_the_object_still_repaired(
        kube: RunningEmulator, admin: Cluster, operator_kube: Kube,
        events: list[tuple[str, str]], plugin: bool) -> None:
    kube.emulator.enforce_owner_references = plugin
    memo = memo_of(admin, operator_kube)
    body = made(admin, memo)
    ours = refs_of(admin, *SERVICE)
    add_owner(admin, *SERVICE, ARGO)
    admin.kube.patch(*SERVICE[:2], NS, SERVICE[2], DRIFT)
    drift_event(admin, memo, *SERVICE)
    assert refused(kube) == []  # the plugin had nothing to refuse: no list was changed
    service = admin.owned(*SERVICE)
    assert service["metadata"]["ownerReferences"] == [*ours, ARGO]
    assert service["spec"]["selector"]["slopilot.dev/llmdeployment"] == "chat"
    reconciled = admin.condition("Reconciled")
    assert (reconciled["status"], reconciled["reason"]) == ("True", "DriftRepaired"), reconciled
    assert ("DriftRepaired", "patched Service/chat") in events
    # And the next look (the timer, an event, a resume) finds nothing to write.
    out = reconcile(operator_kube, admin.get(), policy=memo.policy, mint=memo.tokens)
    assert set(out.changes.values()) == {Change.UNCHANGED}, out
    assert body["metadata"]["uid"] == ours[0]["uid"]


def test_a_foreign_owner_reference_alone_is_no_drift(
        kube: RunningEmulator, admin: Cluster, operator_kube: Kube,
        events: list[tuple[str, str]]) -> None:
    """Its own event (the reference added) used to be a patch that removed it again,
    and with the other controller adding it back, a write war."""
    kube.emulator.enforce_owner_references = True
    memo = memo_of(admin, operator_kube)
    made(admin, memo)
    for api, plural, name in (SERVICE, ("apps/v1", "deployments", "chat"),
                              ("networking.k8s.io/v1", "networkpolicies", "chat"),
                              ("v1", "configmaps", "chat-engine")):
        add_owner(admin, api, plural, name, ARGO)
        before = admin.owned(api, plural, name)["metadata"]["resourceVersion"]
        drift_event(admin, memo, api, plural, name)
        assert admin.owned(api, plural, name)["metadata"]["resourceVersion"] == before
    assert refused(kube) == [] and events == []


def unmarked(ref: dict[str, Any], field: str) -> dict[str, Any]:
    return {k: v for k, v in ref.items() if k != field}


@pytest.mark.parametrize("field", ["controller", "blockOwnerDeletion"])
def test_its_own_reference_unmarked_is_put_right_and_the_others_kept(
        kube: RunningEmulator, admin: Cluster, operator_kube: Kube,
        events: list[tuple[str, str]], field: str) -> None:
    """Someone took the controller mark (or blockOwnerDeletion) off the CR's reference,
    with Argo CD's beside it: the object still names the CR by uid, and no other
    controller claims it, so the reference is put back as the operator sets it, in its
    place, and Argo CD's stays."""
    memo = memo_of(admin, operator_kube)
    made(admin, memo)
    [ours] = refs_of(admin, *SERVICE)
    admin.kube.patch(*SERVICE[:2], NS, SERVICE[2],
                     {"metadata": {"ownerReferences": [unmarked(ours, field), ARGO]}})
    drift_event(admin, memo, *SERVICE)
    assert refs_of(admin, *SERVICE) == [ours, ARGO]
    assert ("DriftRepaired", "patched Service/chat") in events
    assert refused(kube) == []


def test_a_reference_added_meanwhile_is_not_dropped_by_the_one_put_right(
        kube: RunningEmulator, admin: Cluster, operator_kube: Kube,
        events: list[tuple[str, str]], monkeypatch: pytest.MonkeyPatch) -> None:
    """The list goes whole, on condition of the version it was read at: a reference
    another writer added between the read and the write is not overwritten (409), and
    the next look keeps it too."""
    memo = memo_of(admin, operator_kube)
    body = made(admin, memo)
    [ours] = refs_of(admin, *SERVICE)
    admin.kube.patch(*SERVICE[:2], NS, SERVICE[2],
                     {"metadata": {"ownerReferences": [unmarked(ours, "controller")]}})
    backup = {**ARGO, "kind": "Backup", "name": "nightly", "uid": "b0b0b0b0-0000-4000-8000"}
    patch, pending = operator_kube.patch, [lambda: add_owner(admin, *SERVICE, backup)]

    def patch_after(*args: Any, **kwargs: Any) -> Any:
        if args[1] == "services" and pending:
            pending.pop()()
        return patch(*args, **kwargs)

    monkeypatch.setattr(operator_kube, "patch", patch_after)
    with pytest.raises(ApiError, match="409"):
        reconcile(operator_kube, body, policy=memo.policy, mint=memo.tokens)
    assert refs_of(admin, *SERVICE) == [unmarked(ours, "controller"), backup]
    out = reconcile(operator_kube, admin.get(), policy=memo.policy, mint=memo.tokens)
    assert out.changes["Service/chat"] is Change.PATCHED
    assert refs_of(admin, *SERVICE) == [ours, backup]


def test_under_the_plugin_its_own_reference_is_reported_and_the_rest_repaired(
        kube: RunningEmulator, admin: Cluster, operator_kube: Kube,
        events: list[tuple[str, str]]) -> None:
    """Putting the CR's own reference right changes the list, which the plugin lets
    only who may delete the object do: refused, once a look, and said so, while the
    object's other drift is repaired (it used to go in the same refused patch)."""
    kube.emulator.enforce_owner_references = True
    memo = memo_of(admin, operator_kube)
    made(admin, memo)
    [ours] = refs_of(admin, *SERVICE)
    admin.kube.patch(*SERVICE[:2], NS, SERVICE[2],
                     {"metadata": {"ownerReferences": [unmarked(ours, "controller"), ARGO]},
                      **DRIFT})
    drift_event(admin, memo, *SERVICE)
    assert refused(kube) == ["delete services"]
    service = admin.owned(*SERVICE)
    assert service["spec"]["selector"]["slopilot.dev/llmdeployment"] == "chat"
    assert service["metadata"]["ownerReferences"] == [unmarked(ours, "controller"), ARGO]
    reconciled = admin.condition("Reconciled")
    assert (reconciled["status"], reconciled["reason"]) == ("False", "DriftNotRepaired")
    for words in ("Service/chat: its owner reference to this LLMDeployment",
                  "OwnerReferencesPermissionEnforcement", "needs delete on it",
                  "set that reference right by hand, or delete the object",
                  "the rest of the object was repaired", "tries again every 60 s"):
        assert words in reconciled["message"], reconciled["message"]
    # The timer's next look: one more refusal, the condition as it was (not rewritten).
    drift_handler(retry_drift_repair, memo, body=admin.get(),
                  logger=logging.getLogger(__name__))
    assert refused(kube) == ["delete services"] * 2
    assert admin.condition("Reconciled") == reconciled
    # The spec's own reconcile says the same, and is not retried by kopf at 10 s.
    handlers.reconcile_spec(body=admin.get(), memo=memo, logger=logging.getLogger(__name__))
    assert admin.condition("Reconciled")["reason"] == "DriftNotRepaired"
    assert any(reason == "DriftNotRepaired" and "Service/chat" in message
               for reason, message in events), events
    assert admin.condition("Valid")["status"] == "True"


def test_another_controller_is_reported_not_fought(
        kube: RunningEmulator, admin: Cluster, operator_kube: Kube,
        events: list[tuple[str, str]]) -> None:
    """Another controller took the Service (its reference the controller, the CR's left
    as a plain owner): the operator neither rewrites the list nor the object, and says
    which object and which controller, as for a taken name."""
    kube.emulator.enforce_owner_references = True
    memo = memo_of(admin, operator_kube)
    made(admin, memo)
    [ours] = refs_of(admin, *SERVICE)
    theirs = {**ARGO, "controller": True}
    admin.kube.patch(*SERVICE[:2], NS, SERVICE[2],
                     {"metadata": {"ownerReferences": [{**ours, "controller": False},
                                                       theirs]}, **DRIFT})
    before = admin.owned(*SERVICE)
    drift_event(admin, memo, *SERVICE)
    assert admin.owned(*SERVICE) == before and refused(kube) == []
    reconciled = admin.condition("Reconciled")
    assert (reconciled["status"], reconciled["reason"]) == ("False", "DriftNotRepaired")
    for words in ("Service/chat names this LLMDeployment as an owner",
                  f"Application/team-apps (uid {ARGO['uid']}) is its controller",
                  "does not take an object from another controller",
                  "remove that controller reference"):
        assert words in reconciled["message"], reconciled["message"]
    with pytest.raises(kopf.TemporaryError) as retry:
        handlers.reconcile_spec(body=admin.get(), memo=memo,
                                logger=logging.getLogger(__name__))
    assert retry.value.delay == RETRY_NAME_TAKEN_S
    assert admin.condition("Reconciled")["reason"] == Refusal.NAME_TAKEN.value
    assert any(reason == "NameTaken" and "Application/team-apps" in message
               for reason, message in events), events
    assert admin.owned(*SERVICE) == before


def test_an_object_that_names_the_cr_nowhere_is_still_not_adopted(
        kube: RunningEmulator, admin: Cluster, operator_kube: Kube) -> None:
    """The CR's reference removed altogether, Argo CD's kept: nothing left says the
    object is the CR's (a name and labels anyone can copy), so it is a taken name, as an
    object of the name someone else made is, not adopted back."""
    memo = memo_of(admin, operator_kube)
    body = made(admin, memo)
    admin.kube.patch(*SERVICE[:2], NS, SERVICE[2], {"metadata": {"ownerReferences": [ARGO]}})
    out = reconcile(operator_kube, body, policy=memo.policy, mint=memo.tokens)
    assert out.refusal is Refusal.NAME_TAKEN
    assert refs_of(admin, *SERVICE) == [ARGO]
