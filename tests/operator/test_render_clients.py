"""``spec.clients`` rendered: the grants in the ConfigMap, ``--clients`` on the command.

The built-in engine re-reads the file when the kubelet updates it, so an edit of the keys
must change the ConfigMap and leave the pod template (the GPU pods) alone; adding or
removing ``spec.clients`` rolls the pods, as the flag comes and goes with it.
"""

from __future__ import annotations

import copy
import json

import kubernetes.client
import kubernetes_validate
import pytest

from slopilot.engine.clients import ClientClasses
from slopilot.operator.crd import crd_manifest
from slopilot.operator.engine_deployment import CHECKSUM_ANNOTATION
from slopilot.operator.kubeapi import Kube
from slopilot.operator.policy import OperatorPolicy
from slopilot.operator.reconcile import Change, reconcile
from tests.operator.operator_support import NS, Cluster, llmd, operator_mint
from tests.operator.test_spec_clients import KEY_A, digest, engine, grants, rendered
from tests.support.kube_server import RunningEmulator


def test_the_grants_reach_the_configmap_and_the_engine_is_told_to_read_them() -> None:
    out = rendered(clients=grants())
    data = out.config_map["data"]
    assert data["clients.json"] == json.dumps(ClientClasses.from_dict(grants()).to_dict(),
                                              sort_keys=True)
    assert ClientClasses.from_dict(json.loads(data["clients.json"])) == ClientClasses.from_dict(
        grants())
    assert KEY_A not in json.dumps(out.objects())  # digests only, never a key
    c = engine(out)
    assert c["command"][-2:] == ["--clients", "/etc/slopilot/clients.json"]
    # The ConfigMap's directory, never a subPath: the kubelet updates a directory mount in
    # place, and the server re-reads the file when it changes.
    mount = next(m for m in c["volumeMounts"] if m["name"] == "engine-config")
    assert mount == {"name": "engine-config", "mountPath": "/etc/slopilot", "readOnly": True}
    volume = next(v for v in out.deployment["spec"]["template"]["spec"]["volumes"]
                  if v["name"] == "engine-config")
    assert volume == {"name": "engine-config", "configMap": {"name": "chat-engine"}}
    for obj in (out.config_map, out.deployment):
        kubernetes_validate.validate(obj, "1.33.0", strict=True)


def test_an_edit_of_the_keys_changes_the_configmap_and_not_the_pod_template() -> None:
    before = rendered(clients=grants())
    edited = grants()
    edited["keys"][1]["maxClass"] = "p0"
    edited["keys"].append({"name": "batch", "sha256": digest("sk-batch"), "maxClass": "p2"})
    del edited["anonymous"]
    after = rendered(clients=edited)
    assert before.config_map["data"]["clients.json"] != after.config_map["data"]["clients.json"]
    assert before.deployment == after.deployment  # no GPU pod rolls: the file is re-read


def test_adding_or_removing_clients_rolls_the_pods_as_the_flag_comes_and_goes() -> None:
    without, with_ = rendered(), rendered(clients=grants())
    assert engine(without)["command"] + ["--clients", "/etc/slopilot/clients.json"] == engine(
        with_)["command"]
    templates = [o.deployment["spec"]["template"] for o in (without, with_)]
    assert templates[0] != templates[1]
    # The checksum is the restart knobs', as before: the command is what changed.
    assert templates[0]["metadata"]["annotations"][CHECKSUM_ANNOTATION] == templates[1][
        "metadata"]["annotations"][CHECKSUM_ANNOTATION]


def test_the_rendered_serve_command_is_one_the_cli_takes() -> None:
    """The render and ``slopilot serve`` are written apart: a flag renamed on one side
    would crash-loop every built-in pod."""
    from slopilot.cli import build_parser

    command = engine(rendered(clients=grants()))["command"]
    assert command[:2] == ["slopilot", "serve"]
    args, unknown = build_parser().parse_known_args(command[1:])
    assert str(args.config) == "/etc/slopilot/engine.json"
    assert (str(args.clients), unknown) == ("/etc/slopilot/clients.json", [])


# -- through the API -------------------------------------------------------------------


def test_an_edit_of_the_keys_patches_the_configmap_and_leaves_the_deployment(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient) -> None:
    kube.install(crd_manifest())
    cluster = Cluster(kube_client)
    cluster.create(llmd(clients=grants()))
    k = Kube(kube_client)
    policy, mint = OperatorPolicy(), operator_mint(cluster)
    first = reconcile(k, cluster.get(), policy=policy, mint=mint)
    assert set(first.changes.values()) == {Change.CREATED}
    deployment = k.get("apps/v1", "deployments", NS, "chat")
    assert deployment is not None
    edited = copy.deepcopy(grants())
    edited["keys"][0]["sha256"] = digest("sk-checkout-rotated-00112233445566")
    cluster.patch("chat", {"spec": {"clients": edited}})
    changes = reconcile(k, cluster.get(), policy=policy, mint=mint).changes
    assert changes["ConfigMap/chat-engine"] is Change.PATCHED
    assert changes["Deployment/chat"] is Change.UNCHANGED
    cm = k.get("v1", "configmaps", NS, "chat-engine")
    assert cm is not None
    assert ClientClasses.from_dict(json.loads(cm["data"]["clients.json"])) == \
        ClientClasses.from_dict(edited)
    after = k.get("apps/v1", "deployments", NS, "chat")
    assert after is not None
    assert after["metadata"]["resourceVersion"] == deployment["metadata"]["resourceVersion"]


def test_the_api_server_refuses_a_vllm_deployment_with_grants(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient) -> None:
    kube.install(crd_manifest())
    with pytest.raises(kubernetes.client.ApiException) as caught:
        Cluster(kube_client).create(llmd(backend="vllm", clients=grants()))
    assert caught.value.status == 422
    assert "spec.clients" in str(caught.value.body)
