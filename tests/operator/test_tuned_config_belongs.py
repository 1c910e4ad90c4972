"""Which spec ``status.tunedConfig`` belongs to: its sections as the parse reads them (a
CRD upgrade that adds a default changes nothing), the backend and model it was tuned on
(a switch leaves it behind, and says so), and a record an earlier release wrote."""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from typing import Any

import kubernetes.client

from slopilot.operator.crd import API_VERSION, PLURAL, crd_manifest
from slopilot.operator.knobs import engine_checksum, tuned_overlay, tuned_record
from slopilot.operator.kubeapi import Kube
from slopilot.operator.policy import OperatorPolicy
from slopilot.operator.reconcile import reconcile
from slopilot.operator.spec import parse_spec
from slopilot.operator.spec_status import status_of
from slopilot.operator.status_writer import write_status
from tests.operator.operator_support import NS, Cluster, llmd, operator_mint
from tests.support.crd_schema import apply_defaults, served_schema
from tests.support.kube_server import RunningEmulator


def released_checksum(body: Mapping[str, Any]) -> str:
    """``engine_checksum`` as the release of 2026-12-06 wrote it: the raw JSON's hash,
    every default the API server had filled in included."""
    spec = body.get("spec") or {}
    payload = {"engine": spec.get("engine") or {}, "slo": spec.get("slo") or {}}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def crd_before_vllm_class_default() -> dict[str, Any]:
    """Today's CRD without ``spec.slo.vllmClass``'s default, as the CRD was before
    2c878dc gave it one."""
    crd = copy.deepcopy(crd_manifest())
    for version in crd["spec"]["versions"]:
        slo = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["slo"]
        del slo["properties"]["vllmClass"]["default"]
    return crd


def record(kube_client: kubernetes.client.ApiClient, tuned: Mapping[str, Any]) -> None:
    Kube(kube_client).patch(API_VERSION, PLURAL, NS, "chat",
                            {"status": {"tunedConfig": dict(tuned)}}, subresource="status")


def vllm_args(kube_client: kubernetes.client.ApiClient) -> list[str]:
    d = Kube(kube_client).get("apps/v1", "deployments", NS, "chat")
    assert d is not None
    container = next(c for c in d["spec"]["template"]["spec"]["containers"]
                     if "--max-num-seqs" in (c.get("args") or c.get("command") or []))
    return list(container.get("args") or container["command"])


def arg(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


# --- D2: the checksum over what the parse reads, defaults or none -----------------------

def test_the_checksum_is_the_same_before_and_after_the_crds_defaults_apply() -> None:
    schema = served_schema(crd_manifest())
    for spec in ({"model": {"name": "smollm2-135m"}},
                 {"model": {"name": "smollm2-135m"}, "slo": {"profile": "strict"},
                  "engine": {"tokenBudget": 2048, "preemption": {"mode": "swap"}}},
                 {"model": {"name": "smollm2-135m"}, "slo": {"vllmClass": "p1"}}):
        raw = llmd(**{k: v for k, v in spec.items() if k != "model"})
        defaulted = apply_defaults(schema, raw)
        assert defaulted["spec"]["slo"] != raw["spec"].get("slo")  # the CRD did default
        assert engine_checksum(defaulted) == engine_checksum(raw), spec


def test_a_value_the_user_changes_still_changes_the_checksum() -> None:
    schema = served_schema(crd_manifest())
    base = apply_defaults(schema, llmd(slo={"profile": "standard"}))
    for edit in ({"slo": {"vllmClass": "p1"}}, {"slo": {"profile": "strict"}},
                 {"engine": {"tokenBudget": 2048}}):
        edited = copy.deepcopy(base)
        for section, values in edit.items():
            edited["spec"].setdefault(section, {}).update(values)
        assert engine_checksum(edited) != engine_checksum(base), edit


def test_an_old_releases_record_keeps_its_config_through_a_crd_default_upgrade(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient) -> None:
    """The reviewer's case: a CR created under the CRD before ``vllmClass`` had a
    default, its config recorded by the release of that day; today's CRD applied."""
    kube.install(crd_before_vllm_class_default())
    cluster = Cluster(kube_client)
    cluster.create(llmd(slo={"profile": "standard"}))
    body = cluster.get()
    assert "vllmClass" not in body["spec"]["slo"]
    engine = parse_spec(body).engine.to_dict()
    engine.update(token_budget=2048, chunk_size=256)
    record(kube_client, {"engine": engine, "base": released_checksum(body)})
    assert parse_spec(cluster.get()).engine.token_budget == 2048
    new = crd_manifest()
    Kube(kube_client).patch("apiextensions.k8s.io/v1", "customresourcedefinitions", None,
                            new["metadata"]["name"], {"spec": new["spec"]})
    # A write admits the object with today's defaults (an API server fills them on read).
    cluster.patch("chat", {"metadata": {"labels": {"team": "a"}}})
    body = cluster.get()
    assert body["spec"]["slo"]["vllmClass"] == "p0"
    assert tuned_overlay(body) is not None
    assert parse_spec(body).engine.token_budget == 2048


def test_a_record_todays_release_wrote_still_belongs_after_the_upgrade(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient) -> None:
    """This release's checksum is another form: a record in the old one (written under
    today's CRD, its defaults in the hash) is not dropped by the upgrade to it, nor is
    one whose spec writes a default out itself."""
    kube.install(crd_manifest())
    cluster = Cluster(kube_client)
    cluster.create(llmd(slo={"profile": "standard", "maxPreemptionsPerMinute": 10},
                        engine={"tokenBudget": 1024}))
    body = cluster.get()
    engine = parse_spec(body).engine.to_dict()
    engine.update(token_budget=2048, chunk_size=256)
    record(kube_client, {"engine": engine, "base": released_checksum(body)})
    assert released_checksum(body) != engine_checksum(body)  # another form indeed
    assert parse_spec(cluster.get()).engine.token_budget == 2048
    # ... and an edit still leaves it behind, in either form
    cluster.patch("chat", {"spec": {"slo": {"profile": "strict"}}})
    assert tuned_overlay(cluster.get()) is None


# --- D1: the backend and the model a config was tuned on -------------------------------

def test_a_backend_switch_leaves_the_builtin_tuned_config_behind_and_says_so(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient) -> None:
    kube.install(crd_manifest())
    cluster = Cluster(kube_client)
    cluster.create(llmd(backend="builtin", tuning={"enabled": True}))
    policy = OperatorPolicy()
    reconcile(Kube(kube_client), cluster.get(), policy=policy, mint=operator_mint(cluster))
    body = cluster.get()
    engine = parse_spec(body).engine.to_dict()
    engine.update(token_budget=128, chunk_size=64, max_num_seqs=8)
    tuned = tuned_record(body, engine, trial=False)
    assert tuned is not None and tuned["backend"] == "builtin"
    record(kube_client, tuned)
    assert parse_spec(cluster.get()).engine.max_num_seqs == 8
    cluster.patch("chat", {"spec": {"backend": "vllm"}})
    body = cluster.get()
    assert tuned_overlay(body) is None
    spec = parse_spec(body)
    said = [w for w in spec.warnings if "status.tunedConfig" in w]
    assert len(said) == 1 and "backend builtin" in said[0] and "vllm" in said[0], said
    out = reconcile(Kube(kube_client), body, policy=policy, mint=operator_mint(cluster))
    assert out.valid and said[0] in out.warnings
    args = vllm_args(kube_client)
    assert arg(args, "--max-num-seqs") == "256"
    assert arg(args, "--long-prefill-token-threshold") == "512"
    # and back: the built-in engine's own tuned config belongs to it again
    cluster.patch("chat", {"spec": {"backend": "builtin"}})
    assert parse_spec(cluster.get()).engine.max_num_seqs == 8


def _vllm_cr_with_eight_sequences(kube: RunningEmulator,
                                  kube_client: kubernetes.client.ApiClient
                                  ) -> tuple[Cluster, dict[str, Any], dict[str, Any]]:
    """A vLLM CR as created, and its engine config with ``max_num_seqs`` 8 to record."""
    kube.install(crd_manifest())
    cluster = Cluster(kube_client)
    cluster.create(llmd(backend="vllm"))
    body = cluster.get()
    engine = parse_spec(body).engine.to_dict()
    engine.update(max_num_seqs=8)
    return cluster, body, engine


def _builtin_cr(kube: RunningEmulator, kube_client: kubernetes.client.ApiClient) -> Cluster:
    """A built-in engine's CR as created."""
    kube.install(crd_manifest())
    cluster = Cluster(kube_client)
    cluster.create(llmd(backend="builtin"))
    return cluster


def _reconciled(kube_client: kubernetes.client.ApiClient, cluster: Cluster) -> None:
    """The CR reconciled as it is, its status written through the API's merge patch, as
    the operator does."""
    outcome = reconcile(Kube(kube_client), cluster.get(), policy=OperatorPolicy(),
                        mint=operator_mint(cluster))
    write_status(Kube(kube_client), NS, "chat", lambda fresh: status_of(fresh, outcome))


def test_a_model_switch_leaves_the_tuned_config_behind(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient) -> None:
    cluster, body, engine = _vllm_cr_with_eight_sequences(kube, kube_client)
    record(kube_client, tuned_record(body, engine, trial=False) or {})
    assert tuned_overlay(cluster.get()) is not None
    cluster.patch("chat", {"spec": {"model": {"name": "meta-llama/Llama-3.1-70B-Instruct"}}})
    body = cluster.get()
    assert tuned_overlay(body) is None
    assert parse_spec(body).engine.max_num_seqs == 256
    said = [w for w in parse_spec(body).warnings if "status.tunedConfig" in w]
    assert len(said) == 1 and "smollm2-135m" in said[0] and "Llama-3.1-70B" in said[0]


def test_a_record_without_backend_or_model_belongs_to_the_current_ones(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient) -> None:
    """Today's release recorded neither: absent means the current, so the upgrade to
    this one keeps every such record, and no warning is said for it."""
    cluster, body, engine = _vllm_cr_with_eight_sequences(kube, kube_client)
    record(kube_client, {"engine": engine, "base": released_checksum(body)})
    body = cluster.get()
    assert parse_spec(body).engine.max_num_seqs == 8
    assert not [w for w in parse_spec(body).warnings if "status.tunedConfig" in w]


def test_the_first_reconcile_stamps_a_record_of_the_earlier_release_with_its_backend(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient) -> None:
    """Absent means the current only until this release's first reconcile of the CR
    (kopf's resume handler runs one for each at the start): it writes the current
    backend and model in, so a switch after the upgrade leaves the record behind too."""
    cluster = _builtin_cr(kube, kube_client)
    body = cluster.get()
    engine = parse_spec(body).engine.to_dict()
    engine.update(token_budget=128, chunk_size=64, max_num_seqs=8)
    record(kube_client, {"engine": engine, "base": released_checksum(body)})
    _reconciled(kube_client, cluster)
    tuned = cluster.get()["status"]["tunedConfig"]
    assert (tuned["backend"], tuned["model"]) == ("builtin", "smollm2-135m")
    assert tuned["engine"] == engine and tuned["base"] == released_checksum(body)
    assert parse_spec(cluster.get()).engine.max_num_seqs == 8
    cluster.patch("chat", {"spec": {"backend": "vllm"}})
    assert tuned_overlay(cluster.get()) is None


def test_a_trials_record_left_by_a_switch_applies_only_its_committed_knobs_back(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient) -> None:
    """A trial's record (16 sequences, over the committed 8) when the spec switches to
    vLLM: the switch ends the trial, and switched back its knobs went to the pods as if
    committed. The reconcile of the switch keeps only the committed record."""
    cluster = _builtin_cr(kube, kube_client)
    policy, mint = OperatorPolicy(), operator_mint(cluster)
    body = cluster.get()
    committed = parse_spec(body).engine.to_dict()
    committed.update(token_budget=128, chunk_size=64, max_num_seqs=8)
    record(kube_client, tuned_record(body, committed, trial=False) or {})
    body = cluster.get()
    trial = {**committed, "max_num_seqs": 16}
    record(kube_client, tuned_record(body, trial, trial=True) or {})
    assert parse_spec(cluster.get()).engine.max_num_seqs == 16  # the trial runs
    cluster.patch("chat", {"spec": {"backend": "vllm"}})
    outcome = reconcile(Kube(kube_client), cluster.get(), policy=policy, mint=mint)
    write_status(Kube(kube_client), NS, "chat", lambda fresh: status_of(fresh, outcome))
    tuned = cluster.get()["status"]["tunedConfig"]
    assert "trial" not in tuned and "committed" not in tuned
    assert tuned["engine"] == committed and tuned["backend"] == "builtin"
    cluster.patch("chat", {"spec": {"backend": "builtin"}})
    assert parse_spec(cluster.get()).engine.max_num_seqs == 8


def test_a_trials_record_left_by_a_switch_with_nothing_committed_is_dropped(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient) -> None:
    cluster = _builtin_cr(kube, kube_client)
    body = cluster.get()
    trial = parse_spec(body).engine.to_dict()
    trial.update(max_num_seqs=16)
    # No committed config beneath it: recorded as the trial's alone.
    record(kube_client, {**(tuned_record(body, trial, trial=False) or {}), "trial": True})
    cluster.patch("chat", {"spec": {"model": {"name": "tiny-random"}}})
    _reconciled(kube_client, cluster)
    assert cluster.get()["status"].get("tunedConfig") is None
    cluster.patch("chat", {"spec": {"model": {"name": "smollm2-135m"}}})
    assert parse_spec(cluster.get()).engine.max_num_seqs == 256


def reduce_on_switch(kube_client: kubernetes.client.ApiClient, cluster: Cluster,
                     backend: str) -> dict[str, Any]:
    """Switch ``spec.backend``, the switch reconciled (``_reconciled``); the
    ``status.tunedConfig`` left."""
    cluster.patch("chat", {"spec": {"backend": backend}})
    _reconciled(kube_client, cluster)
    return dict(cluster.get()["status"]["tunedConfig"])


def test_a_trial_knob_the_committed_record_lacks_is_not_kept_as_committed(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient) -> None:
    """A committed record an older release wrote, without a knob (chunk_size) the trial
    sets (64): merged into the trial's engine map, the reduction kept the trial's 64 as
    committed, and switched back the pods ran it instead of the spec's 512."""
    cluster = _builtin_cr(kube, kube_client)
    body = cluster.get()
    spec_chunk = parse_spec(body).engine.chunk_size
    committed = parse_spec(body).engine.to_dict()
    committed.update(max_num_seqs=8)
    del committed["chunk_size"]  # no such knob when it was written
    record(kube_client, tuned_record(body, committed, trial=False) or {})
    body = cluster.get()
    trial = {**parse_spec(body).engine.to_dict(), "max_num_seqs": 16, "chunk_size": 64}
    assert spec_chunk != 64
    record(kube_client, tuned_record(body, trial, trial=True) or {})
    tuned = reduce_on_switch(kube_client, cluster, "vllm")
    assert tuned["engine"] == committed
    cluster.patch("chat", {"spec": {"backend": "builtin"}})
    engine = parse_spec(cluster.get()).engine
    assert (engine.max_num_seqs, engine.chunk_size) == (8, spec_chunk)


def test_an_empty_committed_record_keeps_none_of_the_trials_knobs(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient) -> None:
    """``committed: {}`` (no knob over the spec's) beneath a trial: the reduction kept
    the trial's whole engine map as committed."""
    cluster = _builtin_cr(kube, kube_client)
    body = cluster.get()
    trial = {**parse_spec(body).engine.to_dict(), "max_num_seqs": 16}
    record(kube_client, {**(tuned_record(body, trial, trial=True) or {}), "committed": {}})
    tuned = reduce_on_switch(kube_client, cluster, "vllm")
    assert tuned.get("engine") == {} and "trial" not in tuned and "committed" not in tuned
    cluster.patch("chat", {"spec": {"backend": "builtin"}})
    assert parse_spec(cluster.get()).engine.max_num_seqs == 256


def test_the_model_is_what_the_engine_loads_not_the_name_it_is_served_as(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient) -> None:
    """A path added under the name the config was tuned for is a switch: the name is only
    the id the pods serve it as, and nothing the operator reads says what the directory
    holds. Were the name the model, a tenant kept it and pointed the path at other
    weights, and the 135M model's eight sequences went to a 70B's pods. The same
    argument given as a path instead of a name is no switch."""
    cluster, body, engine = _vllm_cr_with_eight_sequences(kube, kube_client)
    record(kube_client, tuned_record(body, engine, trial=False) or {})
    cluster.patch("chat", {"spec": {"model": {"path": "/models/llama-3.1-70b"}}})
    switched = cluster.get()
    assert switched["spec"]["model"]["name"] == "smollm2-135m"
    assert tuned_overlay(switched) is None
    assert parse_spec(switched).engine.max_num_seqs == 256
    said = [w for w in parse_spec(switched).warnings if "status.tunedConfig" in w]
    assert len(said) == 1 and "'/models/llama-3.1-70b'" in said[0]
    # and back: the path removed, the name is what the engine loads again
    cluster.patch("chat", {"spec": {"model": {"path": None}}})
    assert parse_spec(cluster.get()).engine.max_num_seqs == 8
    # the name itself given as the path: the same argument, the same model
    cluster.patch("chat", {"spec": {"model": {"name": "served-as-chat",
                                              "path": "smollm2-135m"}}})
    assert parse_spec(cluster.get()).engine.max_num_seqs == 8
