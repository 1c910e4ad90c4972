"""The twin check reaches the LLMDeployment: status.twin (in the CRD schema) and an event;
the twin's profile shares status.twin with it (status.twin.profile)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import kopf
import kubernetes.client
import pytest

from slopilot.operator import decision_events
from slopilot.operator.crd import crd_manifest, openapi_schema
from slopilot.operator.decision_events import post_decision
from slopilot.operator.kubeapi import Kube
from slopilot.operator.loop_status import status_after
from slopilot.operator.status_writer import write_status
from slopilot.operator.twin_profile import TwinChoice
from slopilot.operator.twin_status import TwinTracker
from slopilot.tuner.loop.settings import TwinCorrection
from tests.operator.operator_support import NS
from tests.operator.test_crd import errors_of, sample
from tests.support.kube_server import RunningEmulator
from tests.support.profiles import make_profile
from tests.tuner.test_twin_check import WINDOW_S, plant


@pytest.mark.parametrize("correction", [TwinCorrection.REFIT, TwinCorrection.NONE])
def test_the_twin_check_is_written_to_status_and_posted(
        correction: TwinCorrection, monkeypatch: pytest.MonkeyPatch) -> None:
    p = plant(twin_correction=correction)
    d = p.ctl.tick(WINDOW_S)
    body = sample("llmdeployment-builtin.yaml")
    body["metadata"] = {"name": "demo", "namespace": "team-a", "generation": 1}
    status = status_after(body, p.ctl, d, "2026-12-01T00:00:00Z")
    twin = status["twin"]
    assert twin["trusted"] is (correction is TwinCorrection.REFIT)
    assert twin["classes"]["p0"]["ttftP99MeasuredMs"] > 0
    assert twin["stepTimeError"] < -0.2
    assert errors_of({**body, "status": status}) == []

    posted: list[tuple[str, str, str]] = []
    monkeypatch.setattr(kopf, "info", lambda _b, *, reason, message: posted.append(
        ("info", reason, message)))
    monkeypatch.setattr(kopf, "warn", lambda _b, *, reason, message: posted.append(
        ("warn", reason, message)))
    post_decision(body, d)
    kinds = {(level, reason) for level, reason, _ in posted}
    expected = ("info", "TwinChecked") if twin["trusted"] else ("warn", "TwinUntrusted")
    assert expected in kinds
    assert any(twin["reason"] in message for _, _, message in posted)
    learned = [m for _, r, m in posted if r.startswith("Twin") and "learned" in m]
    if correction is TwinCorrection.REFIT:  # what the refit moved, in the event too
        assert learned and "iteration x" in learned[0], posted
        assert twin["correctionFactors"]["iteration"] > 1.3
    else:
        assert learned == [] and twin["correctionFactors"] == {}


def test_a_tick_without_a_check_posts_no_twin_event(monkeypatch: pytest.MonkeyPatch) -> None:
    p = plant()
    p.ctl.tick(WINDOW_S)
    d = p.ctl.tick(WINDOW_S + 15)  # the trial runs: nothing asked of the twin
    assert d.twin is None
    posted: list[Any] = []
    monkeypatch.setattr(decision_events.kopf, "info", lambda *a, **k: posted.append(k))
    monkeypatch.setattr(decision_events.kopf, "warn", lambda *a, **k: posted.append(k))
    post_decision({"metadata": {}}, d)
    assert posted == []


def test_the_twin_bound_and_correction_come_from_spec_twin() -> None:
    from slopilot.operator.crd import openapi_schema
    from slopilot.operator.daemon import controller_settings
    from slopilot.operator.spec import parse_spec
    from tests.support.crd_schema import apply_defaults

    body = sample("llmdeployment-builtin.yaml")
    defaults = parse_spec(apply_defaults(openapi_schema(), body))
    settings = controller_settings(defaults, "team-a", "chat")
    assert (settings.twin_max_error, settings.twin_correction) == (0.15, TwinCorrection.REFIT)
    body["spec"]["twin"] = {"maxError": 0.3, "correction": "rescale"}
    assert errors_of(body) == []
    settings = controller_settings(parse_spec(apply_defaults(openapi_schema(), body)),
                                   "team-a", "chat")
    assert (settings.twin_max_error, settings.twin_correction) == (0.3, TwinCorrection.RESCALE)


# ------------------------------------------------------------------ one status.twin, two writers

PROFILE = TwinChoice(profile=make_profile(model="smollm2-135m", device="cpu"),
                     source="ConfigMap default/smol-profile key 'profile.yaml'")


def _check_writer(kube: Kube, **settings: Any) -> Callable[[], None]:
    p = plant(**settings)
    d = p.ctl.tick(WINDOW_S)
    assert d.twin is not None

    def write() -> None:
        write_status(kube, NS, "chat", lambda fresh: status_after(
            fresh, p.ctl, d, "2026-12-01T00:00:00Z"))
    return write


@pytest.mark.parametrize("profile_first", [True, False])
def test_status_twin_keeps_the_check_and_the_profile_whichever_writes_last(
        profile_first: bool, kube: RunningEmulator,
        kube_client: kubernetes.client.ApiClient, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.operator.operator_support import Cluster, llmd

    monkeypatch.setattr(kopf, "info", lambda *_a, **_k: None)  # no operator to post events
    monkeypatch.setattr(kopf, "warn", lambda *_a, **_k: None)
    kube.install(crd_manifest())
    cluster = Cluster(kube_client)
    cluster.create(llmd())
    tracker = TwinTracker(cluster.kube, NS, "chat", clock=lambda: 0.0)
    writers = [lambda: tracker.write(PROFILE, 1, lambda _b: True), _check_writer(cluster.kube)]
    for write in writers if profile_first else writers[::-1]:
        write()
    twin = cluster.status()["twin"]
    assert twin["profile"] == PROFILE.status() and twin["profile"]["calibrated"] is True
    assert isinstance(twin["trusted"], bool) and twin["classes"]["p0"]["ttftP99MeasuredMs"] > 0
    assert "twinProfile" not in cluster.status()
    assert cluster.condition("TwinCalibrated")["reason"] == "ProfileLoaded"
    # The profile goes: status.twin.profile says so, without a stale source, and the
    # check's fields stay.
    tracker.write(TwinChoice(), 2, lambda _b: True)
    twin = cluster.status()["twin"]
    assert twin["profile"] == TwinChoice().status() and "source" not in twin["profile"]
    assert isinstance(twin["trusted"], bool)


def test_a_check_that_learned_nothing_clears_what_an_earlier_one_learned(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The status is written by JSON merge patch, where a map merges: without a null per
    # feature the cluster would keep the refit's factors under an uncorrected check.
    from tests.operator.operator_support import Cluster, llmd

    monkeypatch.setattr(kopf, "info", lambda *_a, **_k: None)
    monkeypatch.setattr(kopf, "warn", lambda *_a, **_k: None)
    kube.install(crd_manifest())
    cluster = Cluster(kube_client)
    cluster.create(llmd())
    _check_writer(cluster.kube)()
    assert cluster.status()["twin"]["correctionFactors"]["iteration"] > 1.3
    _check_writer(cluster.kube, twin_correction=TwinCorrection.NONE)()
    twin = cluster.status()["twin"]
    assert twin["correction"] == "none" and not twin.get("correctionFactors"), twin


def test_the_check_patch_nulls_only_what_the_check_no_longer_holds() -> None:
    from slopilot.operator.twin_status import check_patch

    before = {"trusted": True, "profile": {"calibrated": True, "source": "cm"},
              "correctionFactors": {"iteration": 2.0, "tokens": 1.2},
              "classes": {"p0": {"ttftP99MeasuredMs": 10.0, "tbtP99MeasuredMs": 2.0},
                          "p2": {"ttftP99MeasuredMs": 30.0}}}
    check = {"trusted": False, "correctionFactors": {"tokens": 1.1},
             "classes": {"p0": {"ttftP99MeasuredMs": 12.0}}}
    assert check_patch(check, before) == {
        "trusted": False, "correctionFactors": {"iteration": None, "tokens": 1.1},
        "classes": {"p0": {"ttftP99MeasuredMs": 12.0, "tbtP99MeasuredMs": None},
                    "p2": None}}
    # No status yet, or a hostile one that is not a map: the check as it is.
    for nothing in (None, "x", {"correctionFactors": ["iteration"], "classes": 3}):
        assert check_patch(check, nothing) == check


def test_the_controllers_saved_state_keeps_no_field_an_earlier_tick_wrote() -> None:
    # status.controller is what a restarted operator resumes from: merged over the old
    # one, it would keep an earlier check's factors (and any field since dropped).
    p = plant(twin_correction=TwinCorrection.NONE)
    d = p.ctl.tick(WINDOW_S)
    body = sample("llmdeployment-builtin.yaml")
    body["metadata"] = {"name": "demo", "namespace": "team-a", "generation": 1}
    body["status"] = {"controller": {"twin": {"correctionFactors": {"iteration": 2.0}},
                                     "left_by_a_newer_operator": 1}}
    status = status_after(body, p.ctl, d, "2026-12-01T00:00:00Z")
    saved = status["controller"]
    assert saved["twin"]["correctionFactors"] == {"iteration": None}
    assert saved["left_by_a_newer_operator"] is None
    # Applied as the API server applies a merge patch, it leaves exactly today's state.
    assert merged(body["status"]["controller"], saved) == without_nulls(p.ctl.to_dict())


def merged(target: Any, patch: Any) -> Any:
    """RFC 7386, as the API server applies a merge patch."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merged(out.get(k), v)
    return out


def without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    return value


def test_the_crd_has_no_twin_profile_status_but_a_profile_under_twin() -> None:
    status = openapi_schema()["properties"]["status"]["properties"]
    assert "twinProfile" not in status
    assert set(status["twin"]["properties"]["profile"]["properties"]) == {
        "calibrated", "source", "runs"}


class _ConfigMaps:
    """A Kube's ``get`` for ConfigMaps alone, counting the reads."""

    def __init__(self) -> None:
        self.reads = 0

    def get(self, api_version: str, plural: str, namespace: str, name: str
            ) -> dict[str, Any]:
        self.reads += 1
        return {"metadata": {"resourceVersion": "2"}}


def test_the_profile_is_looked_at_again_right_after_the_clock_stepped_back() -> None:
    """Timed on the operator's clock: stepped back a day (an NTP step), a profile edited
    then was not seen for that day."""
    from slopilot.operator.twin_spec import ProfileRef

    now = [1_000_000.0]
    maps = _ConfigMaps()
    tracker = TwinTracker(maps, NS, "chat", lambda: now[0])  # type: ignore[arg-type]
    tracker.current = TwinChoice(version="1", ref=ProfileRef("profile"))
    tracker.checked = now[0]
    now[0] -= 86_400.0
    assert tracker.moved() and maps.reads == 1


class _Maps:
    """A namespace's ConfigMaps by name, for ``Kube.get``; each edit a new resourceVersion."""

    def __init__(self) -> None:
        self.maps: dict[str, dict[str, Any]] = {}
        self.edits = 0

    def put(self, name: str, data: dict[str, str], labels: dict[str, str] | None = None
            ) -> None:
        self.edits += 1
        self.maps[name] = {"metadata": {"name": name, "resourceVersion": str(self.edits),
                                        "labels": labels or {}}, "data": data}

    def get(self, api_version: str, plural: str, namespace: str, name: str
            ) -> dict[str, Any] | None:
        return self.maps.get(name)


def test_an_unlabelled_configmaps_edits_rebuild_nothing_until_the_answer_changes() -> None:
    """Each edit of a ConfigMap the spec named moved its resourceVersion, and the daemon
    rebuilt the controller (a new study handle, a new figures window) though the refusal
    read the same: the CR's author, who may not read the ConfigMap, saw it come into being
    and each edit of it by the rebuilds. A move is now one whose answer differs."""
    from slopilot.engine.sim.profile_file import dump_profile
    from slopilot.operator.spec import parse_spec

    now = [0.0]
    maps = _Maps()
    spec = parse_spec({"metadata": {"name": "chat", "namespace": NS},
                       "spec": {"model": {"name": "smollm2-135m"},
                                "twin": {"profile": {"configMapName": "billing"}}}})
    tracker = TwinTracker(maps, NS, "chat", lambda: now[0])  # type: ignore[arg-type]

    def step() -> bool:
        now[0] += 60.0
        moved = tracker.moved()
        if moved or tracker.current is None:  # what DeploymentLoop.step does
            tracker.current = tracker.resolve(spec, 1)
        return moved

    step()
    assert tracker.current is not None and tracker.current.problem is not None
    maps.put("billing", {"db_password": "hunter2"})  # created: no profile, unlabelled
    assert not step()
    maps.put("billing", {"db_password": "hunter3", "profile.yaml": "42"})  # edited
    assert not step()
    maps.put("billing", {"profile.yaml": "42"}, {"slopilot.dev/profile": "true"})
    assert step() and "holds a number" in str(tracker.current.problem)  # its writer's word
    maps.put("billing", {"profile.yaml": dump_profile(make_profile(
        model="smollm2-135m", device="cpu"))})  # unlabelled, but a profile
    assert step() and tracker.current.calibrated
    assert not step()  # nothing moved
