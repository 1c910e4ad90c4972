"""``slopilot serve --clients``: the class a request is served in is its key's to name.

Driven through the app over ASGI (no socket): the key is checked at the door of every
/v1 route, the class where it is decided, and neither refusal is load (no demand, no
verdict). The live server with the openai client is ``test_client_grants_live.py``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from slopilot.engine.clients import ClientsError, read_clients_file
from slopilot.engine.request import Priority
from slopilot.engine.server.app import EngineApp, create_app
from slopilot.engine.server.backends import Backend
from slopilot.engine.slo import SLOSpec
from slopilot.engine.watched_file import WatchedFile
from tests.support.client_keys import digest
from tests.support.live_server import build_backend

CHECKOUT, REPORTS = "sk-checkout-7f3a9c0e5b2d4e6f8a1b", "sk-reports-0c1d2e3f4a5b6c7d8e9f"
SLO = SLOSpec.from_profile("relaxed")


def grants(**extra: Any) -> dict[str, Any]:
    return {"keys": [{"name": "checkout", "sha256": digest(CHECKOUT), "maxClass": "p0"},
                     {"name": "reports", "sha256": digest(REPORTS), "maxClass": "p1",
                      "defaultClass": "p2"}], **extra}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def served_app(clients: dict[str, Any] | None, tmp_path: Path) -> tuple[EngineApp, Backend]:
    backend = build_backend(realtime=False)
    backend.metrics.set_slo(SLO)
    watched = None
    if clients is not None:
        path = tmp_path / "clients.json"
        path.write_text(json.dumps(clients))
        watched = WatchedFile(path, read_clients_file, "client grants", (ClientsError,))
    return create_app(backend, clients=watched), backend


@pytest.fixture
async def app_of(tmp_path: Path) -> AsyncIterator[Any]:
    """``app_of(grants or None)``: an httpx client on a started app (its engine running),
    and the backend whose metrics it feeds."""
    started: list[Any] = []

    async def start(clients: dict[str, Any] | None) -> tuple[httpx.AsyncClient, Backend]:
        app, backend = served_app(clients, tmp_path)
        lifespan = app.public.router.lifespan_context(app.public)
        await lifespan.__aenter__()
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                   base_url="http://engine")
        started.append((lifespan, client))
        return client, backend

    yield start
    for lifespan, client in reversed(started):
        await client.aclose()
        await lifespan.__aexit__(None, None, None)


def error_of(res: httpx.Response, status: int) -> dict[str, Any]:
    assert res.status_code == status, res.text
    err: dict[str, Any] = res.json()["error"]
    return err


def served_classes(backend: Backend) -> dict[str, float]:
    """Finished requests by class, as the e2e histogram counts them."""
    return {s.labels["priority_class"]: s.value
            for f in text_string_to_metric_families(backend.metrics.render().decode())
            for s in f.samples if s.name == "vllm:e2e_request_latency_seconds_count"}


def samples(backend: Backend, name: str, *labels: str) -> dict[tuple[str, ...], float]:
    """``name``'s samples, by the values of ``labels``."""
    return {tuple(s.labels[k] for k in labels): s.value
            for f in text_string_to_metric_families(backend.metrics.render().decode())
            for s in f.samples if s.name == name}


ASK = {"prompt": "hello there", "max_tokens": 2, "ignore_eos": True}


@pytest.mark.parametrize(("method", "path"), [
    ("POST", "/v1/completions"), ("POST", "/v1/chat/completions"), ("GET", "/v1/models"),
    ("GET", "/v1/no-such-route"), ("POST", "/v1")])
async def test_without_a_granted_key_every_v1_route_is_401(app_of: Any, method: str,
                                                            path: str) -> None:
    """As vLLM's --api-key: before the body is read, so nothing about it is learnt."""
    client, _ = await app_of(grants())
    res = await client.request(method, path, content=b"{not json", headers=bearer("EMPTY"))
    err = error_of(res, 401)
    assert err["code"] == "invalid_api_key" and err["type"] == "authentication_error"
    assert res.headers["www-authenticate"] == "Bearer"
    assert "Authorization: Bearer <key>" in err["message"]


async def test_health_metrics_and_the_admin_api_are_not_the_grants_business(
        app_of: Any) -> None:
    client, _ = await app_of(grants())
    assert (await client.get("/health")).status_code == 200
    assert (await client.get("/metrics")).status_code == 200
    # The admin API has its own token: a client key is no admin token, and no admin
    # token is needed to be refused it.
    res = await client.get("/admin/config", headers=bearer(CHECKOUT))
    assert error_of(res, 403)["message"].startswith("the admin API is disabled")


async def test_a_granted_key_is_served_in_the_class_it_names_or_its_default(
        app_of: Any) -> None:
    client, backend = await app_of(grants())
    res = await client.post("/v1/completions", json={**ASK, "priority": "p0"},
                            headers=bearer(CHECKOUT))
    assert res.status_code == 200, res.text
    res = await client.post("/v1/completions", json=ASK, headers=bearer(REPORTS))
    assert res.status_code == 200, res.text  # named none: its defaultClass, p2
    res = await client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        headers={**bearer(CHECKOUT), "x-slopilot-priority": "p1"})
    assert res.status_code == 200, res.text
    assert served_classes(backend) == {"p0": 1, "p1": 1, "p2": 1}
    assert (await client.get("/v1/models", headers=bearer(REPORTS))).status_code == 200


@pytest.mark.parametrize(("body", "headers", "param"), [
    ({"priority": "p0"}, {}, "priority"),
    ({"priority": 0}, {"x-slopilot-priority": "p2"}, "priority"),  # the body wins
    ({}, {"x-slopilot-priority": "realtime"}, "x-slopilot-priority"),
])
async def test_a_class_above_the_grant_is_403_naming_what_the_client_used(
        app_of: Any, body: dict[str, Any], headers: dict[str, str], param: str) -> None:
    client, backend = await app_of(grants())
    res = await client.post("/v1/completions", json={**ASK, **body},
                            headers={**bearer(REPORTS), **headers})
    err = error_of(res, 403)
    assert err["code"] == "priority_not_allowed" and err["type"] == "permission_error"
    assert err["param"] == param
    assert "client 'reports' may name p1, p2 (not p0)" in err["message"]
    assert served_classes(backend) == {"p0": 0, "p1": 0, "p2": 0}


async def test_the_body_wins_over_the_header_as_without_grants(app_of: Any) -> None:
    client, backend = await app_of(grants())
    res = await client.post("/v1/completions", json={**ASK, "priority": "p1"},
                            headers={**bearer(REPORTS), "x-slopilot-priority": "p0"})
    assert res.status_code == 200, res.text
    assert served_classes(backend)["p1"] == 1


async def test_the_anonymous_grant_serves_a_client_without_a_key(app_of: Any) -> None:
    client, backend = await app_of(grants(anonymous={"maxClass": "p2"}))
    for headers in ({}, bearer("EMPTY"), {"Authorization": "Basic dXNlcjpwYXNz"}):
        res = await client.post("/v1/completions", json=ASK, headers=headers)
        assert res.status_code == 200, res.text
    err = error_of(await client.post("/v1/completions", json={**ASK, "priority": 1}), 403)
    assert "client 'anonymous' may name p2 (not p1)" in err["message"]
    assert served_classes(backend) == {"p0": 0, "p1": 0, "p2": 3}


@pytest.mark.parametrize("authorization", [
    b"Bearer " + b"k" * 100_000,  # hashed, never echoed
    "Bearer clé-\u00e9t\u00e9".encode(),  # not ASCII: read as Latin-1, an unknown key
    b"Bearer \xff\xfe",
    b"Bearer",
    b"Bearer ",
    b"bearer" + CHECKOUT.encode(),  # no space: no scheme, no key
])
async def test_what_an_attacker_sends_as_a_key_is_no_key(app_of: Any,
                                                         authorization: bytes) -> None:
    client, backend = await app_of(grants())
    res = await client.post("/v1/completions", json={**ASK, "priority": 0},
                            headers=[(b"authorization", authorization)])
    err = error_of(res, 401)
    assert len(res.content) < 400 and "kkkk" not in err["message"]
    assert served_classes(backend) == {"p0": 0, "p1": 0, "p2": 0}


async def test_a_huge_integer_class_is_a_400_for_a_granted_key_and_a_401_without(
        app_of: Any) -> None:
    client, backend = await app_of(grants())
    body = json.dumps({**ASK, "priority": 10 ** 4000}).encode()  # under int's 4300 digits
    res = await client.post("/v1/completions", content=body, headers={
        **bearer(CHECKOUT), "content-type": "application/json"})
    assert error_of(res, 400)["param"] == "priority"
    res = await client.post("/v1/completions", content=body,
                            headers={"content-type": "application/json"})
    error_of(res, 401)
    assert served_classes(backend) == {"p0": 0, "p1": 0, "p2": 0}


async def test_refused_requests_are_no_demand_and_no_verdict(app_of: Any) -> None:
    """A 401 or 403 is the client's error, as a 400 is: not turned away for load, not a
    miss of the class it asked for, not a finished request."""
    client, backend = await app_of(grants())
    for key, priority in (("EMPTY", 0), (REPORTS, 0), ("", 2), (REPORTS, "realtime")):
        res = await client.post("/v1/completions", json={**ASK, "priority": priority},
                                headers=bearer(key) if key else {})
        assert res.status_code in (401, 403), res.text
    metrics = backend.metrics
    assert metrics.refused() == dict.fromkeys(Priority, 0)
    assert metrics.retries(refused=True) == dict.fromkeys(Priority, 0)
    assert all(count == (0, 0) for count in metrics.verdicts().values())
    assert served_classes(backend) == {"p0": 0, "p1": 0, "p2": 0}
    assert samples(backend, "slopilot_client_refusals_total", "client", "reason") == {
        ("anonymous", "unknown_key"): 2, ("reports", "class_not_allowed"): 2}
    assert samples(backend, "slopilot_client_requests_total", "client",
                     "priority_class") == {
        ("checkout", "p0"): 0, ("checkout", "p1"): 0, ("checkout", "p2"): 0,
        ("reports", "p1"): 0, ("reports", "p2"): 0}


async def test_the_per_client_counters_count_what_each_key_was_served_in(
        app_of: Any) -> None:
    client, backend = await app_of(grants())
    for key, body in ((CHECKOUT, {"priority": "p0"}), (CHECKOUT, {}), (REPORTS, {}),
                      (REPORTS, {"priority": 1})):
        res = await client.post("/v1/completions", json={**ASK, **body}, headers=bearer(key))
        assert res.status_code == 200, res.text
    await client.get("/v1/models", headers=bearer(CHECKOUT))  # no class: not a request
    served = samples(backend, "slopilot_client_requests_total", "client",
                     "priority_class")
    assert {k: v for k, v in served.items() if v} == {
        ("checkout", "p0"): 1, ("checkout", "p1"): 1, ("reports", "p1"): 1,
        ("reports", "p2"): 1}


async def test_without_grants_a_key_is_ignored_and_any_class_served(app_of: Any) -> None:
    client, backend = await app_of(None)
    for headers in ({}, bearer("EMPTY"), {"Authorization": "x" * 10_000}):
        res = await client.post("/v1/completions", json={**ASK, "priority": "p0"},
                                headers=headers)
        assert res.status_code == 200, res.text
    assert served_classes(backend)["p0"] == 3
    text = backend.metrics.render().decode()
    assert "slopilot_client_" not in text


def test_a_removed_client_leaves_no_series_behind() -> None:
    """Bounded by the grants: a key removed from the file takes its series with it (kept,
    each edit that renames keys would leave more series in the Prometheus all tenants
    share); a client that stays keeps its counts."""
    from slopilot.engine.clients import ClientClasses, Refusal
    from slopilot.engine.server.client_counts import ClientCounts

    counts = ClientCounts("m")
    first = ClientClasses.from_dict(grants())
    counts.set_clients(first)
    counts.count_served("checkout", Priority.P0)
    counts.count_served("reports", Priority.P2)
    counts.count_refused("reports", Refusal.CLASS_NOT_ALLOWED)
    counts.count_refused("anonymous", Refusal.UNKNOWN_KEY)
    only_checkout = {"keys": grants()["keys"][:1], "anonymous": {"maxClass": "p1"}}
    counts.set_clients(ClientClasses.from_dict(only_checkout))
    assert counts.served() == {("checkout", Priority.P0): 1, ("checkout", Priority.P1): 0,
                               ("checkout", Priority.P2): 0, ("anonymous", Priority.P1): 0,
                               ("anonymous", Priority.P2): 0}
    # anonymous is always a client: its refusals stay though it is now granted.
    assert counts.refused() == {("anonymous", Refusal.UNKNOWN_KEY): 1,
                                ("anonymous", Refusal.CLASS_NOT_ALLOWED): 0}


def test_the_client_series_are_exported_series() -> None:
    from slopilot.engine.metric_names import exported_series

    assert {"slopilot_client_requests_total",
            "slopilot_client_refusals_total"} <= exported_series()
