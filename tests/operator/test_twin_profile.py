"""``spec.twin.profile``: the operator's twin on a calibrated profile from a ConfigMap.

What a tenant gets right (a profile for the model, in a ConfigMap of the CR's namespace)
and wrong or hostile (another namespace, a path-like name, a huge ConfigMap, a missing
key, another model's or device's profile, broken YAML, a stale profile): each refused
with a message naming the ConfigMap, the key and the fix, and the twin on the datasheet.
"""

# mypy: disable-error-code="attr-defined,index,union-attr,arg-type"

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest

from slopilot.engine.sim.profile_file import MAX_PROFILE_BYTES, dump_profile
from slopilot.engine.sim.scenario import load_scenario
from slopilot.engine.sim.twin import twin_label
from slopilot.operator.daemon import prometheus_controller
from slopilot.operator.kubeapi import Kube
from slopilot.operator.spec import SpecError, parse_spec
from slopilot.operator.twin_profile import TwinChoice, resolve_twin
from slopilot.operator.twin_spec import ProfileRef
from slopilot.tuner.prometheus.adapters import PrometheusProbe
from tests.operator.test_production_wiring import context
from tests.support.kube_server import RunningEmulator
from tests.support.profiles import make_profile

NS = "team"
SMOL = dict(model="smollm2-135m", device="cpu")


def body(twin: Any = None, **spec: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"metadata": {"name": "chat", "namespace": NS},
                           "spec": {"model": {"name": "smollm2-135m"}, **spec}}
    if twin is not None:
        out["spec"]["twin"] = twin
    return out


def ref(name: str = "smol-profile", key: str | None = None) -> dict[str, Any]:
    r: dict[str, Any] = {"configMapName": name}
    if key is not None:
        r["key"] = key
    return {"profile": r}


# ------------------------------------------------------------------ the spec's field

def test_the_spec_names_a_configmap_key_of_its_own_namespace() -> None:
    assert parse_spec(body()).twin.profile is None
    assert parse_spec(body(ref())).twin.profile == ProfileRef("smol-profile", "profile.yaml")
    assert parse_spec(body(ref("a.b", "cpu.yaml"))).twin.profile == ProfileRef("a.b",
                                                                                "cpu.yaml")


@pytest.mark.parametrize(("twin", "message"), [
    (ref("other-team/profiles"), "a ConfigMap name only, without a namespace"),
    (ref("../../secrets/token"), "without a namespace"),
    (ref("Profiles"), "not a ConfigMap name"),
    (ref("x" * 300), "at most 253"),
    (ref(""), "expected the name of a ConfigMap"),
    (ref("ok", "a/b"), "spec.twin.profile.key='a/b': not a ConfigMap key"),
    (ref("ok", ".."), "not a ConfigMap key"),
    ({"profile": {"configMapName": "ok", "namespace": "other-team"}},
     "spec.twin.profile.namespace: not allowed"),
    ({"profile": {"configMapName": "ok", "name": "x"}}, "unknown field(s) name"),
    ({"profile": "smol-profile"}, "expected {configMapName: NAME"),
    ({"calibrated": True}, "spec.twin: unknown field(s) calibrated"),
    ("yes", "spec.twin='yes': expected a mapping"),
])
def test_a_hostile_or_wrong_reference_is_refused_naming_the_field(twin: Any,
                                                                  message: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_spec(body(twin))
    assert any(message in p for p in err.value.problems), err.value.problems


def test_the_crd_schema_checks_the_reference_too() -> None:
    from slopilot.operator.crd import openapi_schema

    spec = openapi_schema()["properties"]["spec"]["properties"]
    profile = spec["twin"]["properties"]["profile"]
    assert set(profile["properties"]) == {"configMapName", "key"}  # no namespace
    assert profile["required"] == ["configMapName"]
    assert "/" not in profile["properties"]["configMapName"]["pattern"]
    assert profile["properties"]["key"]["default"] == "profile.yaml"


# ------------------------------------------------------------------ reading the ConfigMap

@pytest.fixture
def core(kube_client: kubernetes.client.ApiClient) -> kubernetes.client.CoreV1Api:
    return kubernetes.client.CoreV1Api(kube_client)


def put(core: kubernetes.client.CoreV1Api, name: str, data: dict[str, str],
        namespace: str = NS, labelled: bool = False, **extra: Any) -> None:
    """``labelled``: the ``slopilot.dev/profile=true`` label, its writer's word that the
    CR may be told what is wrong with it."""
    meta: dict[str, Any] = {"name": name}
    if labelled:
        meta["labels"] = {"slopilot.dev/profile": "true"}
    core.create_namespaced_config_map(namespace, {"apiVersion": "v1", "kind": "ConfigMap",
                                                  "metadata": meta, "data": data, **extra})


def resolve(kube_client: kubernetes.client.ApiClient, twin: Any = None, **spec: Any
            ) -> TwinChoice:
    return resolve_twin(Kube(kube_client), NS, parse_spec(body(twin or ref(), **spec)))


def test_a_profile_for_the_model_runs_the_twin_and_says_from_where(
        kube_client: kubernetes.client.ApiClient, core: kubernetes.client.CoreV1Api) -> None:
    put(core, "smol-profile", {"profile.yaml": dump_profile(make_profile(**SMOL))})
    twin = resolve(kube_client)
    assert twin.calibrated and twin.problem is None, twin.problem
    assert twin.source == "ConfigMap team/smol-profile key 'profile.yaml'"
    assert twin.status()["calibrated"] is True
    assert "calibrated profile from ConfigMap team/smol-profile" in twin.status()["runs"]
    cond = twin.condition(3)
    assert (cond["type"], cond["status"], cond["reason"]) == (
        "TwinCalibrated", "True", "ProfileLoaded")
    scenario = twin.apply(load_scenario("azure-conv-2023"))
    assert scenario.profile is twin.profile and scenario.model == "SmolLM2-135M"
    assert twin_label(scenario) == "calibrated profile ConfigMap team/smol-profile key " \
                                   "'profile.yaml'"


def test_no_profile_is_the_datasheet_and_says_so() -> None:
    twin = TwinChoice()
    base = load_scenario("azure-conv-2023")
    assert twin.apply(base) is base
    assert twin.status() == {"calibrated": False, "runs": "uncalibrated datasheet roofline "
                             "(no spec.twin.profile)"}
    assert twin.condition(None)["reason"] == "NoProfile"


def _refused(twin: TwinChoice, *needles: str) -> None:
    assert not twin.calibrated and twin.problem is not None
    message = twin.condition(1)["message"]
    for needle in ("ConfigMap team/", *needles, "falls back to the uncalibrated datasheet"):
        assert needle in message, message
    assert twin.condition(1)["reason"] == "ProfileRefused"
    assert twin.status()["calibrated"] is False
    assert "uncalibrated datasheet roofline" in twin.status()["runs"]


def test_a_configmap_of_another_namespace_is_never_read(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient,
        core: kubernetes.client.CoreV1Api) -> None:
    put(core, "smol-profile", {"profile.yaml": dump_profile(make_profile(**SMOL))},
        namespace="other-team")
    twin = resolve(kube_client)
    _refused(twin, "no cost profile there", "not labelled slopilot.dev/profile=true")
    reads = [r for r in list(kube.emulator._requests) if r.method.value == "GET"]
    assert reads and not [r for r in reads if "other-team" in str(r.url)], reads


@pytest.mark.parametrize(("data", "key", "needles"), [
    ({"other.yaml": "x: 1\n"}, None, ("no such key", "its keys are other.yaml",
                                      "spec.twin.profile.key")),
    ({"profile.yaml": "x: [1, 2\n"}, None, ("not valid YAML", "slopilot calibrate")),
    ({"profile.yaml": "schema: nope\n"}, None, ("not a slopilot cost profile",)),
    ({"profile.yaml": "#" * (MAX_PROFILE_BYTES + 1)}, None,
     (f"{MAX_PROFILE_BYTES + 1} bytes is no cost profile",)),
    ({"cpu.yaml": dump_profile(make_profile())}, "cpu.yaml",
     ("key 'cpu.yaml'", "calibrated for model 'Llama-3-8B', not 'smollm2-135m'")),
    ({"profile.yaml": dump_profile(make_profile(model="smollm2-135m", device="cuda"))}, None,
     ("calibrated on a cuda device", "not 'cpu'")),
    ({"profile.yaml": dump_profile(make_profile(**SMOL, executor_code="0123456789abcdef"))},
     None, ("calibrated on executor code 0123456789abcdef", "recalibrate")),
    # Text, never a path: the operator reads no file a tenant names (nor quotes it).
    ({"profile.yaml": "/etc/passwd"}, None, ("holds text, not a YAML mapping",)),
])
def test_a_bad_profile_falls_back_to_the_datasheet_naming_the_configmap_key_and_fix(
        kube_client: kubernetes.client.ApiClient, core: kubernetes.client.CoreV1Api,
        data: dict[str, str], key: str | None, needles: tuple[str, ...]) -> None:
    put(core, "smol-profile", data, labelled=True)
    twin = resolve(kube_client, ref(key=key))
    _refused(twin, "smol-profile", *needles)
    assert len(twin.problem) <= 700  # bounded, whatever the ConfigMap holds


SECRET = "hunter2-s3cr3t"


@pytest.mark.parametrize("text", [
    f"db.password={SECRET}\nuser=admin\n",  # a properties file: YAML reads one string
    f"-----BEGIN PRIVATE KEY-----\n{SECRET}\n-----END PRIVATE KEY-----\n",
    f"settings: [\n  password: {SECRET}: x\n",  # broken YAML: its error quotes the line
    f"password: *{SECRET}\n",  # an unknown alias: its error names it
    f"schema: {SECRET}\n",  # a mapping, but no profile's
    f"- {SECRET}\n",
    f"password: x\npassword: {SECRET}\n",  # a key given twice: not named either
])
@pytest.mark.parametrize("labelled", [False, True])
def test_a_configmap_that_is_no_profile_is_refused_without_a_word_of_what_it_holds(
        kube_client: kubernetes.client.ApiClient, core: kubernetes.client.CoreV1Api,
        text: str, labelled: bool) -> None:
    """A tenant who may create LLMDeployments but not read the namespace's ConfigMaps
    (docs/operations.md: they need no such grant) names one in spec.twin.profile: the
    operator reads it with its own rights, and the refusal, which reaches the CR's status
    and a Warning event, quoted what it held (a line of a properties file, a key's PEM
    body, the YAML parser's snippet), so that any ConfigMap of the namespace could be
    read through the CR's conditions."""
    put(core, "app-config", {"settings": text}, labelled=labelled)
    twin = resolve(kube_client, ref("app-config", "settings"))
    _refused(twin, "app-config", "key 'settings'",
             "not a slopilot cost profile" if labelled else "no cost profile there")
    message = twin.condition(1)["message"]
    assert SECRET not in message and SECRET not in str(twin.status()), message
    assert "password" not in message and "user=admin" not in message, message


def test_a_missing_configmap_or_a_vllm_backend_falls_back(
        kube_client: kubernetes.client.ApiClient, core: kubernetes.client.CoreV1Api) -> None:
    _refused(resolve(kube_client), "no cost profile there", "kubectl -n team create configmap")
    put(core, "smol-profile", {"profile.yaml": dump_profile(make_profile(**SMOL))})
    _refused(resolve(kube_client, backend="vllm"), "times slopilot's built-in engine")
    # A GPU deployment needs a GPU-calibrated profile.
    _refused(resolve(kube_client, resources={"gpu": 1}), "calibrated on a cpu device")


def test_the_default_wiring_plans_on_the_profile(tmp_path: Path) -> None:
    twin = TwinChoice(profile=make_profile(**SMOL), source="ConfigMap team/p key 'k'")
    ctl = prometheus_controller(dataclasses.replace(context(tmp_path), twin=twin))
    assert isinstance(ctl.probe, PrometheusProbe)
    assert ctl.probe.base.profile is twin.profile  # what warm starts and capacity simulate
    plain = prometheus_controller(context(tmp_path))
    assert isinstance(plain.probe, PrometheusProbe) and plain.probe.base.profile is None


# ------------------------------------------------------------------ through the operator

def profile_status(cluster: Any) -> dict[str, Any]:
    return dict((cluster.status().get("twin") or {}).get("profile") or {})


def test_the_operator_says_which_twin_runs_and_rereads_an_edited_configmap(
        kube_login: RunningEmulator, kube_client: kubernetes.client.ApiClient,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from slopilot.operator import twin_status
    from tests.operator.operator_support import NS as DEFAULT_NS
    from tests.operator.operator_support import Cluster, llmd, operator, wait_for
    from tests.operator.standins import PrometheusStandIn, serving

    monkeypatch.setenv("SLOPILOT_CONTROLLER_FACTORY", "tests.operator.standins:build_controller")
    monkeypatch.setenv("SLOPILOT_CONTROLLER_TICK_S", "0.2")
    monkeypatch.setattr(twin_status, "RECHECK_S", 0.0)  # look at the ConfigMap every step
    cluster = Cluster(kube_client)
    put(cluster.core, "smol-profile", {"profile.yaml": dump_profile(make_profile(**SMOL))},
        namespace=DEFAULT_NS)
    prom = PrometheusStandIn()
    with serving(prom), operator(kube_login):
        cluster.create(llmd(prometheus={"url": prom.url}, twin=ref()))
        wait_for(lambda: profile_status(cluster).get("calibrated") is True,
                 what="status.twin.profile on the calibrated profile")
        assert profile_status(cluster)["source"] == \
            f"ConfigMap {DEFAULT_NS}/smol-profile key 'profile.yaml'"
        assert cluster.condition("TwinCalibrated")["reason"] == "ProfileLoaded"
        wait_for(lambda: cluster.events("TwinProfileLoaded"), what="the loaded event")
        # A profile for a GPU replaces it: the twin falls back, and says so.
        cluster.core.patch_namespaced_config_map("smol-profile", DEFAULT_NS, {"data": {
            "profile.yaml": dump_profile(make_profile(model="smollm2-135m", device="cuda"))}})
        wait_for(lambda: (cluster.condition("TwinCalibrated") or {}).get("reason")
                 == "ProfileRefused", what="the edited ConfigMap read again")
        message = cluster.condition("TwinCalibrated")["message"]
        assert "smol-profile" in message and "calibrated on a cuda device" in message
        assert profile_status(cluster)["calibrated"] is False
        assert "twinProfile" not in cluster.status()
        wait_for(lambda: cluster.events("TwinProfileRefused"), what="the refused event")


def test_a_controller_that_cannot_be_built_reads_the_profile_once_per_version(
        kube: RunningEmulator, cluster: Any, prom: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A controller that could not be built is built again at every tick (5 s), and the
    twin was resolved before each try: the tenant's ConfigMap, up to 256 KiB of YAML
    (most of a second of the operator's CPU, under the GIL its handlers share), parsed
    again each time, by each such CR (one named after a taken name never builds). It is
    parsed again once the ConfigMap or the spec changes."""
    from slopilot.operator import twin_profile
    from tests.operator.operator_support import NS as DEFAULT_NS
    from tests.operator.operator_support import daemon_loop, llmd
    from tests.operator.test_live_config import _unbuildable, reconciled

    parses: list[str] = []
    parse = twin_profile.parse_profile_text

    def counted(text: str, source: str) -> Any:
        parses.append(source)
        return parse(text, source)

    monkeypatch.setattr(twin_profile, "parse_profile_text", counted)
    put(cluster.core, "smol-profile", {"profile.yaml": dump_profile(make_profile(**SMOL))},
        namespace=DEFAULT_NS)
    body, _, _ = reconciled(kube, cluster, llmd(
        prometheus={"url": prom.url}, tuning={"window": "1h"}, twin=ref()))
    loop = daemon_loop(cluster, body, monkeypatch, factory=_unbuildable)
    for _ in range(3):
        assert loop.step() and loop.controller is None
    assert len(parses) == 1
    cluster.core.patch_namespaced_config_map("smol-profile", DEFAULT_NS, {"data": {
        "profile.yaml": dump_profile(make_profile(model="smollm2-135m", device="cuda"))}})
    assert loop.step() and len(parses) == 2
    cluster.patch("chat", {"spec": {"engine": {"maxNumSeqs": 64}}})
    assert loop.step() and len(parses) == 3
    assert loop.step() and len(parses) == 3


# ------------------------------------------------------------------ hostile profiles

def _edited(line: str) -> str:
    """A profile for the model with its line of ``line``'s key replaced by ``line``."""
    key = line.split(":")[0] + ":"
    return "\n".join(old[:old.index(key)] + line if old.lstrip().startswith(key) else old
                     for old in dump_profile(make_profile(**SMOL)).splitlines()) + "\n"


@pytest.mark.parametrize(("text", "needles"), [
    # datetime's ValueError escaped resolve_twin: the daemon crashed, restarted every
    # 10 s for ever, and the CR never said why its twin was not tuning.
    (_edited("created: 2026-02-30"), ("created (line", "day is out of range", "quote it")),
    (_edited("num_layers: " + "9" * 5000), ("model.shape.num_layers", "4300 digits")),
    # Coefficients of zero: "ProfileLoaded", a twin of unlimited capacity.
    (dump_profile(make_profile(**SMOL, executor={}, host={})),
     ("cheapest step", "no engine step takes under 10 us")),
    # YAML kept the last silently: a tenant's edit appended was taken over the first.
    (dump_profile(make_profile(**SMOL)) + "name: edited\n",
     ("name given twice (line", "keep the one you mean")),
])
def test_a_profile_the_reader_refuses_is_refused_on_the_cr_never_raised(
        kube_client: kubernetes.client.ApiClient, core: kubernetes.client.CoreV1Api,
        text: str, needles: tuple[str, ...]) -> None:
    put(core, "smol-profile", {"profile.yaml": text})
    twin = resolve(kube_client)
    _refused(twin, "smol-profile", *needles)
    assert len(twin.problem) <= 700


def test_a_value_no_profile_could_hold_is_refused_by_place_alone(
        kube_client: kubernetes.client.ApiClient, core: kubernetes.client.CoreV1Api) -> None:
    # A ConfigMap that does not declare itself a profile is quoted nowhere (see above),
    # nor is the value its YAML could not convert.
    put(core, "app-config", {"settings": f"when: 2026-02-30\nwho: {SECRET}\n"}, labelled=True)
    twin = resolve(kube_client, ref("app-config", "settings"))
    _refused(twin, "app-config", "line 1, column 7", "not a slopilot cost profile")
    assert "2026" not in twin.problem and "when" not in twin.problem, twin.problem


def test_every_field_the_status_quotes_is_bounded(
        kube_client: kubernetes.client.ApiClient, core: kubernetes.client.CoreV1Api) -> None:
    # A name of 100,000 characters was copied whole into status.twin.profile.runs and
    # into the TwinCalibrated condition's message.
    for name, calibrated in (("A" * 1000, True), ("A" * 100_000, False)):
        long = dataclasses.replace(make_profile(**SMOL), name=name)
        put(core, f"long-{len(name)}", {"profile.yaml": dump_profile(long)})
        twin = resolve(kube_client, ref(f"long-{len(name)}"))
        assert twin.calibrated is calibrated, twin.problem
        assert len(twin.status()["runs"]) < 400, len(twin.status()["runs"])
        assert len(twin.condition(1)["message"]) < 800, len(twin.condition(1)["message"])
        assert "AAAA" in (twin.status()["runs"] if calibrated else twin.problem)
        if not calibrated:  # refused by the reader, by its length
            assert "100,000 characters; at most 1,024" in twin.problem, twin.problem


def test_a_refused_profile_is_reported_by_the_daemon_once_per_configmap_version(
        kube: RunningEmulator, cluster: Any, prom: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``resolve_twin`` raised out of ``DeploymentLoop.step()``: kopf restarted the daemon
    every 10 s for ever, parsing the ConfigMap again each time, and the CR never got its
    TwinCalibrated condition (tuning silently off)."""
    from slopilot.operator import twin_profile, twin_status
    from tests.operator.operator_support import NS as DEFAULT_NS
    from tests.operator.operator_support import daemon_loop, llmd
    from tests.operator.test_live_config import reconciled

    reads: list[str] = []
    parse = twin_profile.safe_load_bounded

    def counted(text: str, **kw: Any) -> Any:
        reads.append(text[:10])
        return parse(text, **kw)

    monkeypatch.setattr(twin_profile, "safe_load_bounded", counted)
    warnings: list[str] = []  # kopf posts events only inside its own handlers
    monkeypatch.setattr(twin_status.kopf, "warn",
                        lambda body, *, reason, message: warnings.append(reason))
    put(cluster.core, "smol-profile", {"profile.yaml": _edited("created: 2026-02-30")},
        namespace=DEFAULT_NS)
    body, _, _ = reconciled(kube, cluster, llmd(
        prometheus={"url": prom.url}, tuning={"window": "1h"}, twin=ref()))
    loop = daemon_loop(cluster, body, monkeypatch)
    for _ in range(3):
        assert loop.step() and loop.controller is not None  # on the datasheet
    cond = cluster.condition("TwinCalibrated")
    assert cond is not None and cond["reason"] == "ProfileRefused", cond
    assert "created (line" in cond["message"] and "quote it" in cond["message"], cond
    assert len(reads) == 1 and warnings == ["TwinProfileRefused"]


def test_whatever_reading_a_profile_raises_is_a_refusal_not_a_crash(
        kube_client: kubernetes.client.ApiClient, core: kubernetes.client.CoreV1Api,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from slopilot.operator import twin_profile

    def broken(text: str, source: str) -> Any:
        raise RecursionError("deep inside a reader")

    monkeypatch.setattr(twin_profile, "parse_profile_text", broken)
    put(core, "smol-profile", {"profile.yaml": dump_profile(make_profile(**SMOL))})
    twin = resolve(kube_client)
    _refused(twin, "smol-profile", "the operator could not read it (RecursionError, in its "
             "log)", "kubectl create configmap")
    assert "deep inside a reader" in caplog.text  # the traceback, for whoever runs it


def test_the_default_wiring_plans_on_the_dispatch_the_cr_names(tmp_path: Path) -> None:
    from slopilot.engine.sim.dispatch import Dispatch
    ctx = context(tmp_path)
    ctl = prometheus_controller(ctx)
    assert isinstance(ctl.probe, PrometheusProbe)
    assert ctl.probe.base.dispatch is Dispatch.RANDOM  # the Service's kube-proxy
    routed = dataclasses.replace(ctx, spec=dataclasses.replace(
        ctx.spec, twin=dataclasses.replace(ctx.spec.twin,
                                           dispatch=Dispatch.LEAST_REQUESTS)))
    ctl = prometheus_controller(routed)
    assert isinstance(ctl.probe, PrometheusProbe)
    assert ctl.probe.base.dispatch is Dispatch.LEAST_REQUESTS


# ------------------------------------------------------------------ what a tenant may learn

LABELLED = {"labels": {"slopilot.dev/profile": "true"}}
SECRETISH = {"stripe_live_key": "sk_live_abc", "db_password": "hunter2",
             "max_spend_usd": "25000", "fraud_enabled": "true", "notes.yaml": "a: 1\nb: [\n",
             "big": "#" * (MAX_PROFILE_BYTES + 1), "app.properties": "user=admin\n",
             "settings": "when: 2026-02-30\n", "dup": "a: 1\na: 2\n",
             "other": "schema: nope\n"}


def _labelled(core: kubernetes.client.CoreV1Api, name: str, data: dict[str, str],
              binary: dict[str, str] | None = None) -> None:
    core.create_namespaced_config_map(NS, {"apiVersion": "v1", "kind": "ConfigMap",
                                           "metadata": {"name": name, **LABELLED},
                                           "data": data, "binaryData": binary or {}})


@pytest.mark.parametrize("key", ["nope", "stripe_live_key", "max_spend_usd", "fraud_enabled",
                                 "notes.yaml", "big", "app.properties", "settings", "dup",
                                 "other", "bin"])
def test_an_unlabelled_configmap_is_refused_in_the_same_words_whatever_it_holds(
        kube_client: kubernetes.client.ApiClient, core: kubernetes.client.CoreV1Api,
        key: str, caplog: pytest.LogCaptureFixture) -> None:
    """A tenant who may create LLMDeployments but not read ConfigMaps named one (a key at a
    time) and read back its key names, whether it existed, each value's type (a number,
    true or false), a YAML error's line and column and an oversized value's exact size.
    Unless the ConfigMap is labelled a profile (its writer's word, which the CR's author
    cannot forge), missing ConfigMap, missing key and no profile read the same: the CR is
    told the fix, the operator's log the detail."""
    caplog.set_level("INFO")
    missing = resolve(kube_client, ref("billing", key))  # before the ConfigMap exists
    core.create_namespaced_config_map(NS, {"apiVersion": "v1", "kind": "ConfigMap",
                                           "metadata": {"name": "billing"}, "data": SECRETISH,
                                           "binaryData": {"bin": "AAEC"}})
    twin = resolve(kube_client, ref("billing", key))
    assert not twin.calibrated
    assert twin.condition(1) == missing.condition(1)  # the event posts this message too
    assert twin.status() == missing.status() and twin.describe() == missing.describe()
    message = twin.condition(1)["message"].replace(f"'{key}'", "'KEY'").replace(
        f"={key}=", "=KEY=")  # the key the CR itself names
    for leak in ("stripe", "db_password", "its keys", "a number", "true or false",
                 "holds text", "at line", "column", "bytes", "binaryData", "valid YAML",
                 "twice", "no such"):
        assert leak not in message, (leak, message)
    for fix in ("ConfigMap team/billing key", "slopilot calibrate",
                "slopilot.dev/profile=true", "falls back to the uncalibrated datasheet"):
        assert fix in message, (fix, message)
    assert "ConfigMap team/billing" in caplog.text  # the detail, for the administrator


def test_a_vllm_deployment_is_refused_before_the_configmap_is_read(
        kube_client: kubernetes.client.ApiClient, core: kubernetes.client.CoreV1Api) -> None:
    # Refused after the read, it said that a ConfigMap of that name and key existed.
    missing = resolve(kube_client, ref("billing", "db_password"), backend="vllm")
    core.create_namespaced_config_map(NS, {"apiVersion": "v1", "kind": "ConfigMap",
                                           "metadata": {"name": "billing"}, "data": SECRETISH})
    twin = resolve(kube_client, ref("billing", "db_password"), backend="vllm")
    assert twin.condition(1) == missing.condition(1)
    assert "times slopilot's built-in engine" in twin.condition(1)["message"]


@pytest.mark.parametrize(("key", "needles"), [
    ("nope", ("no such key", "its keys are")),
    ("max_spend_usd", ("holds a number",)),
    ("notes.yaml", ("not valid YAML at line 3",)),
    ("big", (f"{MAX_PROFILE_BYTES + 1} bytes is no cost profile",)),
    ("bin", ("it is under binaryData",)),
])
def test_a_labelled_configmap_gets_the_detailed_refusal(
        kube_client: kubernetes.client.ApiClient, core: kubernetes.client.CoreV1Api,
        key: str, needles: tuple[str, ...]) -> None:
    _labelled(core, "billing", SECRETISH, {"bin": "AAEC"})
    _refused(resolve(kube_client, ref("billing", key)), f"key '{key}'", *needles)


def test_an_unlabelled_profile_still_loads(
        kube_client: kubernetes.client.ApiClient, core: kubernetes.client.CoreV1Api) -> None:
    # Installs from before the label keep their twin; only refusals say less.
    put(core, "smol-profile", {"profile.yaml": dump_profile(make_profile(**SMOL))})
    assert resolve(kube_client).calibrated


def test_an_unlabelled_value_that_names_no_profile_schema_is_not_parsed(
        kube_client: kubernetes.client.ApiClient, core: kubernetes.client.CoreV1Api,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Parsing up to 256 KiB of YAML takes most of a second, a missing key none: how long
    the condition took to come told a large value from a missing one. An unlabelled
    value without the profile's schema string is refused unparsed, as cheaply as a
    missing key; a labelled one, or one that names the schema, is parsed."""
    from slopilot.operator import twin_profile

    parsed: list[int] = []
    parse = twin_profile.safe_load_bounded

    def counted(text: str, **kw: Any) -> Any:
        parsed.append(len(text))
        return parse(text, **kw)

    monkeypatch.setattr(twin_profile, "safe_load_bounded", counted)
    big = "x: " + "a" * (MAX_PROFILE_BYTES - 10) + "\n"
    put(core, "billing", {"big": big, "p": dump_profile(make_profile(**SMOL))})
    put(core, "marked", {"big": big}, labelled=True)
    assert resolve(kube_client, ref("billing", "big")).problem is not None
    assert parsed == []
    assert resolve(kube_client, ref("billing", "p")).calibrated and len(parsed) == 1
    assert resolve(kube_client, ref("marked", "big")).problem is not None
    assert len(parsed) == 2
