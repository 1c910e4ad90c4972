"""Each apiserver behaviour the emulator adds, seen through the official client (37)."""

# Client 37 types its bodies as pydantic models and its results as optionals; these tests
# send plain dicts (as kubectl does) and read results the server always fills in.
# mypy: disable-error-code="arg-type,union-attr,index,operator"

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, watch

from slopilot.operator.crd import crd_manifest
from slopilot.operator.kubeapi import Kube
from tests.support.kube_server import RunningEmulator
from tests.support.waits import HANG_GUARD_S

LLMD = ("slopilot.dev", "v1alpha1")


def reason(exc: client.ApiException) -> str:
    return str(json.loads(exc.body)["reason"])


@pytest.fixture
def core(kube_client: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(kube_client)


@pytest.fixture
def custom(kube: RunningEmulator,
           kube_client: client.ApiClient) -> Iterator[client.CustomObjectsApi]:
    kube.install(crd_manifest())
    yield client.CustomObjectsApi(kube_client)


def llmd(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "slopilot.dev/v1alpha1", "kind": "LLMDeployment",
            "metadata": {"name": name}, "spec": {"model": {"name": "tiny"}, **spec}}


def test_create_answers_201_with_server_filled_metadata(core: client.CoreV1Api) -> None:
    cm, status, _ = core.create_namespaced_config_map_with_http_info(
        "default", {"metadata": {"name": "a"}, "data": {"k": "v"}})
    assert status == 201
    assert cm.metadata.uid and cm.metadata.creation_timestamp is not None
    assert cm.metadata.namespace == "default"  # from the URL; the body had none
    assert cm.kind == "ConfigMap" and cm.api_version == "v1"
    second = core.create_namespaced_config_map("default", {"metadata": {"name": "b"}})
    assert int(second.metadata.resource_version) > int(cm.metadata.resource_version)
    assert second.metadata.uid != cm.metadata.uid


def test_generate_name_and_missing_name(core: client.CoreV1Api) -> None:
    made = core.create_namespaced_config_map("default", {"metadata": {"generateName": "x-"}})
    assert made.metadata.name.startswith("x-") and len(made.metadata.name) == 7
    with pytest.raises(client.ApiException) as err:
        core.create_namespaced_config_map("default", {"metadata": {}})
    assert err.value.status == 422 and reason(err.value) == "Invalid"


def test_not_found_already_exists_and_conflict_reasons(core: client.CoreV1Api) -> None:
    with pytest.raises(client.ApiException) as err:
        core.read_namespaced_config_map("nope", "default")
    assert err.value.status == 404 and reason(err.value) == "NotFound"
    assert 'configmaps "nope" not found' in json.loads(err.value.body)["message"]
    old = core.create_namespaced_config_map("default", {"metadata": {"name": "a"}})
    with pytest.raises(client.ApiException) as err:
        core.create_namespaced_config_map("default", {"metadata": {"name": "a"}})
    assert err.value.status == 409 and reason(err.value) == "AlreadyExists"
    core.patch_namespaced_config_map("a", "default", {"data": {"k": "1"}})
    stale = {"metadata": {"name": "a", "resourceVersion": old.metadata.resource_version}}
    with pytest.raises(client.ApiException) as err:
        core.replace_namespaced_config_map("a", "default", stale)
    assert err.value.status == 409 and reason(err.value) == "Conflict"
    with pytest.raises(client.ApiException) as err:
        core.delete_namespaced_config_map("nope", "default")
    assert reason(err.value) == "NotFound"


def test_put_replaces_and_keeps_server_fields(core: client.CoreV1Api) -> None:
    made = core.create_namespaced_config_map("default", {"metadata": {"name": "a"},
                                                         "data": {"k": "v", "gone": "x"}})
    new = core.replace_namespaced_config_map("a", "default", {
        "metadata": {"name": "a", "uid": "forged"}, "data": {"k": "w"}})
    assert new.data == {"k": "w"}
    assert new.metadata.uid == made.metadata.uid
    assert new.metadata.creation_timestamp == made.metadata.creation_timestamp


def test_resource_quantities_are_stored_in_canonical_form(
        kube_client: client.ApiClient) -> None:
    """As an API server stores a resource.Quantity: a number comes back a string, and a
    quantity in its canonical form (a drift check that compares what it sent with what
    it reads back must see the same amounts)."""
    kube = Kube(kube_client)  # plain dicts, as the server sent them
    amounts = {"cpu": "0.5", "memory": "1.5Gi", "nvidia.com/gpu": 1}
    container = {"name": "c", "image": "x", "resources": {"requests": amounts,
                                                         "limits": amounts}}
    kube.create("apps/v1", "deployments", "default", {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}, "spec": {
            "selector": {"matchLabels": {"a": "b"}}, "template": {
                "metadata": {"labels": {"a": "b"}},
                "spec": {"containers": [container], "initContainers": [container]}}}})
    kube.patch("apps/v1", "deployments", "default", "d", {"spec": {"template": {"spec": {
        "containers": [{**container, "resources": {"limits": {"cpu": 2000}}}]}}}})
    pod = kube.get("apps/v1", "deployments", "default", "d")["spec"]["template"]["spec"]
    stored = {"cpu": "500m", "memory": "1536Mi", "nvidia.com/gpu": "1"}
    assert pod["initContainers"][0]["resources"] == {"requests": stored, "limits": stored}
    assert pod["containers"][0]["resources"] == {"limits": {"cpu": "2k"}}  # patched too


def test_lists_carry_kind_api_version_and_filter_by_labels(core: client.CoreV1Api,
                                                           custom: client.CustomObjectsApi) -> None:
    core.create_namespaced_config_map("default", {"metadata": {"name": "a", "labels": {"t": "1"}}})
    core.create_namespaced_config_map("default", {"metadata": {"name": "b", "labels": {"t": "2"}}})
    listed = core.list_namespaced_config_map("default", label_selector="t in (1,3)")
    assert (listed.kind, listed.api_version) == ("ConfigMapList", "v1")
    assert [c.metadata.name for c in listed.items] == ["a"]
    assert [c.metadata.name for c in core.list_namespaced_config_map(
        "default", field_selector="metadata.name=b").items] == ["b"]
    crs = custom.list_namespaced_custom_object(*LLMD, "default", "llmdeployments")
    assert (crs["kind"], crs["apiVersion"]) == ("LLMDeploymentList", "slopilot.dev/v1alpha1")


def test_generation_moves_with_spec_only(custom: client.CustomObjectsApi) -> None:
    args = (*LLMD, "default", "llmdeployments", "m")
    made = custom.create_namespaced_custom_object(*LLMD, "default", "llmdeployments", llmd("m"))
    assert made["metadata"]["generation"] == 1
    labelled = custom.patch_namespaced_custom_object(*args, {"metadata": {"labels": {"a": "b"}}})
    assert labelled["metadata"]["generation"] == 1
    respec = custom.patch_namespaced_custom_object(*args, {"spec": {"backend": "vllm"}})
    assert respec["metadata"]["generation"] == 2
    assert int(respec["metadata"]["resourceVersion"]) > int(labelled["metadata"]["resourceVersion"])


def test_status_subresource_and_main_resource_keep_to_their_parts(
        custom: client.CustomObjectsApi) -> None:
    args = (*LLMD, "default", "llmdeployments", "m")
    body = llmd("m")
    body["status"] = {"phase": "Running"}
    made = custom.create_namespaced_custom_object(*LLMD, "default", "llmdeployments", body)
    assert "status" not in made  # status is written through /status only
    after = custom.patch_namespaced_custom_object_status(
        *args, {"spec": {"backend": "vllm"}, "status": {"phase": "Tuning"}})
    assert after["status"] == {"phase": "Tuning"} and after["spec"]["backend"] == "builtin"
    assert after["metadata"]["generation"] == 1
    after = custom.patch_namespaced_custom_object(
        *args, {"spec": {"backend": "vllm"}, "status": {"phase": "Pending"}})
    assert after["status"] == {"phase": "Tuning"} and after["spec"]["backend"] == "vllm"


def test_crd_schema_defaults_and_refuses_invalid_objects(custom: client.CustomObjectsApi) -> None:
    made = custom.create_namespaced_custom_object(*LLMD, "default", "llmdeployments", llmd("m"))
    assert made["spec"]["backend"] == "builtin" and made["spec"]["replicas"] == {"min": 1, "max": 1}
    with pytest.raises(client.ApiException) as err:
        custom.create_namespaced_custom_object(*LLMD, "default", "llmdeployments",
                                               llmd("bad", engine={"tokenBudget": 64}))
    assert err.value.status == 422 and reason(err.value) == "Invalid"
    assert "engine.tokenBudget" in json.loads(err.value.body)["message"]


def test_unknown_fields_are_pruned_as_an_api_server_prunes_them(
        custom: client.CustomObjectsApi) -> None:
    # Without strict field validation an API server drops what the schema does not list,
    # silently; the operator must never see it (nor rely on it being kept).
    body = llmd("m", replicas={"min": 1, "max": 2, "surge": 5})
    body["spec"]["tuning"] = {"maxTrials": 3, "pleaseTuneFaster": True}
    made = custom.create_namespaced_custom_object(*LLMD, "default", "llmdeployments", body)
    assert made["spec"]["replicas"] == {"min": 1, "max": 2}
    assert "pleaseTuneFaster" not in made["spec"]["tuning"]
    assert made["spec"]["tuning"]["maxTrials"] == 3
    stored = custom.get_namespaced_custom_object(*LLMD, "default", "llmdeployments", "m")
    assert stored["spec"] == made["spec"]


def test_json_patch_applies_and_a_failed_test_is_invalid(core: client.CoreV1Api) -> None:
    made = core.create_namespaced_config_map("default", {"metadata": {"name": "a"}})
    rv = made.metadata.resource_version
    ops = [{"op": "test", "path": "/metadata/resourceVersion", "value": rv},
           {"op": "add", "path": "/data", "value": {"k": "v"}}]
    assert core.patch_namespaced_config_map("a", "default", ops).data == {"k": "v"}
    with pytest.raises(client.ApiException) as err:  # rv is stale now
        core.patch_namespaced_config_map("a", "default", ops)
    assert err.value.status == 422 and reason(err.value) == "Invalid"


def test_namespaced_watch_sees_client_writes_in_its_namespace_only(
        kube: RunningEmulator, core: client.CoreV1Api) -> None:
    kube.install({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "other"}})
    start = core.list_namespaced_config_map("default").metadata.resource_version
    core.create_namespaced_config_map("other", {"metadata": {"name": "elsewhere"}})
    core.create_namespaced_config_map("default", {"metadata": {"name": "a"}})
    core.patch_namespaced_config_map("a", "default", {"data": {"k": "v"}})
    core.delete_namespaced_config_map("a", "default")
    seen = [(e["type"], e["object"].metadata.name) for e in watch.Watch().stream(
        core.list_namespaced_config_map, "default", resource_version=start, timeout_seconds=1)]
    assert seen == [("ADDED", "a"), ("MODIFIED", "a"), ("DELETED", "a")]


def test_live_watch_gets_events_as_they_happen(core: client.CoreV1Api) -> None:
    w = watch.Watch()
    seen: list[str] = []
    done = threading.Event()
    listening = threading.Event()
    # A marker that exists before the watch opens: its initial ADDED says the stream is
    # live, so the writes below cannot race the connection.
    core.create_namespaced_config_map("default", {"metadata": {"name": "marker"}})

    def consume() -> None:
        for event in w.stream(core.list_namespaced_config_map, "default",
                              timeout_seconds=math.ceil(HANG_GUARD_S)):
            if event["object"].metadata.name == "marker":
                listening.set()
                continue
            seen.append(event["type"])
            if event["type"] == "DELETED":
                w.stop()
        done.set()

    thread = threading.Thread(target=consume)
    thread.start()
    assert listening.wait(HANG_GUARD_S), "the watch never opened"
    core.create_namespaced_config_map("default", {"metadata": {"name": "a"}})
    core.delete_namespaced_config_map("a", "default")
    assert done.wait(HANG_GUARD_S), "the watch never saw the deletion"
    thread.join(HANG_GUARD_S)
    assert seen[-1] == "DELETED" and "ADDED" in seen


def test_finalizers_hold_deletion_until_released(core: client.CoreV1Api) -> None:
    core.create_namespaced_config_map("default", {"metadata": {"name": "a", "finalizers": ["x/y"]}})
    core.delete_namespaced_config_map("a", "default")
    held = core.read_namespaced_config_map("a", "default")
    assert held.metadata.deletion_timestamp is not None
    core.patch_namespaced_config_map("a", "default", {"metadata": {"finalizers": None}})
    with pytest.raises(client.ApiException) as err:
        core.read_namespaced_config_map("a", "default")
    assert err.value.status == 404


def test_deleting_an_owner_collects_its_dependents(core: client.CoreV1Api) -> None:
    owner = core.create_namespaced_config_map("default", {"metadata": {"name": "owner"}})
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}
    core.create_namespaced_config_map("default", {"metadata": {"name": "child",
                                                               "ownerReferences": [ref]}})
    core.create_namespaced_config_map("default", {"metadata": {"name": "kept"}})
    core.delete_namespaced_config_map("owner", "default")
    names = {c.metadata.name for c in core.list_namespaced_config_map("default").items}
    assert names == {"kept"}


def test_only_one_owner_reference_may_be_the_controller(core: client.CoreV1Api) -> None:
    """As the API server's ValidateOwnerReferences: a second controller is refused, so a
    test cannot make an object two controllers claim, which no cluster holds."""
    refs = [{"apiVersion": "v1", "kind": "ConfigMap", "name": n, "uid": f"uid-{n}",
             "controller": True} for n in ("a", "b")]
    with pytest.raises(client.ApiException) as err:
        core.create_namespaced_config_map("default", {"metadata": {
            "name": "twice", "ownerReferences": refs}})
    assert err.value.status == 422 and reason(err.value) == "Invalid"
    assert ('Only one reference can have Controller set to true. Found "true" in '
            "references for ConfigMap/a and ConfigMap/b") in json.loads(err.value.body)["message"]
    made = core.create_namespaced_config_map("default", {"metadata": {
        "name": "once", "ownerReferences": [refs[0], {**refs[1], "controller": False}]}})
    with pytest.raises(client.ApiException) as err:
        core.patch_namespaced_config_map("once", "default", {"metadata": {
            "ownerReferences": refs}})
    assert err.value.status == 422
    assert made.metadata.owner_references[1].controller is False


def test_orphan_propagation_keeps_dependents(core: client.CoreV1Api) -> None:
    owner = core.create_namespaced_config_map("default", {"metadata": {"name": "owner"}})
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}
    core.create_namespaced_config_map("default", {"metadata": {"name": "child",
                                                               "ownerReferences": [ref]}})
    core.delete_namespaced_config_map("owner", "default", propagation_policy="Orphan")
    assert [c.metadata.name for c in core.list_namespaced_config_map("default").items] == ["child"]


def test_version_and_discovery_of_installed_crds(kube_client: client.ApiClient,
                                                 custom: client.CustomObjectsApi) -> None:
    assert client.VersionApi(kube_client).get_code().major == "1"
    groups = client.ApisApi(kube_client).get_api_versions().groups
    assert "slopilot.dev" in {g.name for g in groups}
    found = custom.get_api_resources(*LLMD)
    by_name = {r.name: r for r in found.resources}
    assert by_name["llmdeployments"].kind == "LLMDeployment"
    assert by_name["llmdeployments"].namespaced is True
    assert "llmdeployments/status" in by_name
    assert {"watch", "patch", "list"} <= set(by_name["llmdeployments"].verbs)


def test_unknown_resources_are_not_found(kube_client: client.ApiClient) -> None:
    with pytest.raises(client.ApiException) as err:
        client.CustomObjectsApi(kube_client).list_namespaced_custom_object(
            "nothing.example", "v1", "default", "things")
    assert err.value.status == 404 and reason(err.value) == "NotFound"


MIB = 1024 * 1024


def test_a_configmap_holds_at_most_1_mib_of_data_as_the_api_server_allows(
        core: client.CoreV1Api) -> None:
    """ValidateConfigMap: the values of ``data`` (their UTF-8 bytes) and of ``binaryData``
    (decoded) together at most 1 MiB (core.MaxSecretSize), on create and on update; the
    keys are not counted. Lenient here, a record that grows past it passed the tests
    and was refused by every cluster."""
    made = core.create_namespaced_config_map("default", {"metadata": {"name": "full"},
                                                         "data": {"a": "x" * MIB}})
    assert len(made.data["a"]) == MIB
    too_long = 'ConfigMap "full" is invalid: []: Too long: may not be more than 1048576 bytes'
    with pytest.raises(client.ApiException) as err:
        core.patch_namespaced_config_map("full", "default", {"data": {"b": "y"}})
    assert err.value.status == 422 and reason(err.value) == "Invalid"
    assert json.loads(err.value.body)["message"] == too_long
    assert set(core.read_namespaced_config_map("full", "default").data) == {"a"}
    for name, body in (("bytes", {"data": {"a": "€" * (MIB // 3 + 1)}}),  # 3 bytes each
                       ("binary", {"data": {"a": "x" * (MIB - 2)},
                                   "binaryData": {"b": "AAAA"}})):  # 3 bytes decoded
        with pytest.raises(client.ApiException) as err:
            core.create_namespaced_config_map("default", {"metadata": {"name": name},
                                                          **body})
        assert err.value.status == 422, name
        assert "Too long: may not be more than 1048576 bytes" in json.loads(
            err.value.body)["message"]


def test_delete_preconditions_hold_as_the_api_server_holds_them(
        core: client.CoreV1Api) -> None:
    """A DELETE with ``preconditions`` deletes only the object still at that uid and
    resourceVersion; otherwise 409 Conflict, nothing deleted (a conditional delete)."""
    made = core.create_namespaced_config_map("default", {"metadata": {"name": "a"}})
    core.patch_namespaced_config_map("a", "default", {"data": {"k": "v"}})
    for stale in ({"resourceVersion": made.metadata.resource_version},
                  {"uid": "0b3c6d3e-1f2a-4b5c-8d9e-0f1a2b3c4d5e"}):
        with pytest.raises(client.ApiException) as err:
            core.delete_namespaced_config_map("a", "default", body={"preconditions": stale})
        assert err.value.status == 409 and reason(err.value) == "Conflict"
        message = json.loads(err.value.body)["message"]
        assert message.startswith('Operation cannot be fulfilled on configmaps "a": ')
        assert "Precondition failed: " in message
    now = core.read_namespaced_config_map("a", "default")
    core.delete_namespaced_config_map("a", "default", body={"preconditions": {
        "uid": now.metadata.uid, "resourceVersion": now.metadata.resource_version}})
    assert core.list_namespaced_config_map("default").items == []
