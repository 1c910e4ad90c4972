"""/admin/config: its own port, the bearer token on every method, whole validation,
staged at the next iteration."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from slopilot.engine.engine import LLMEngine
from slopilot.engine.outputs import SchedulerOutput
from slopilot.engine.request import Request
from slopilot.engine.server.admin_credential import AdminCredential, token_sha256
from slopilot.engine.server.commands import admin_token
from tests.engine.server.conftest import ADMIN_TOKEN
from tests.support.live_server import LiveServer, build_backend, start_server
from tests.support.waits import HANG_GUARD_S, wait_for

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.fixture(scope="module")
def srv() -> Iterator[LiveServer]:
    with start_server(admin_token=ADMIN_TOKEN, admin_port=0) as server:
        yield server


def _put(srv: LiveServer, body: Any, headers: dict[str, str] | None = None) -> httpx.Response:
    kw: dict[str, Any] = {"content": body} if isinstance(body, bytes) else {"json": body}
    return httpx.put(srv.admin_url + "/admin/config", headers=headers or AUTH, timeout=HANG_GUARD_S,
                     **kw)


def _get(srv: LiveServer) -> dict[str, Any]:
    res = httpx.get(srv.admin_url + "/admin/config", headers=AUTH)
    assert res.status_code == 200
    return res.json()


class StepRecorder:
    """Records each iteration's rows (tokens per request) and the config it ran with."""

    def __init__(self) -> None:
        self.steps: list[tuple[list[int], int, int]] = []

    def on_step(self, engine: LLMEngine, out: SchedulerOutput, elapsed_s: float,
                now: float) -> None:
        cfg = engine.scheduler.config
        self.steps.append(([len(s.token_ids) for s in out.seqs], cfg.chunk_size,
                           cfg.effective_budget))

    def on_first_token(self, req: Request, ttft_s: float, now: float) -> None: ...
    def on_token_gap(self, req: Request, gap_s: float, now: float) -> None: ...
    def on_finished(self, req: Request, now: float) -> None: ...


def test_put_is_applied_from_the_next_iteration(srv: LiveServer) -> None:
    res = _put(srv, {"token_budget": 128, "budget_align": 64, "chunk_size": 64,
                     "preemption_mode": "swap"})
    assert res.status_code == 200, res.text
    assert res.json()["chunk_size"] == 64 and res.json()["preemption_mode"] == "swap"
    assert _get(srv) == res.json()
    rec = StepRecorder()
    srv.call(lambda e: e.observers.append(rec))
    done = httpx.post(srv.url + "/v1/completions", timeout=HANG_GUARD_S,
                      json={"prompt": "w " * 300, "max_tokens": 2})
    assert done.status_code == 200
    srv.call(lambda e: e.observers.remove(rec))
    # 300 prompt tokens in chunks of at most 64, every iteration within the new budget.
    assert rec.steps and all(c == 64 and b == 128 for _, c, b in rec.steps)
    rows = [n for seqs, _, _ in rec.steps for n in seqs]
    assert max(rows) == 64 and sum(rows) == 300 + 1
    assert srv.call(lambda e: e.scheduler.config.chunk_size) == 64
    metrics = httpx.get(srv.url + "/metrics").text
    assert 'slopilot_config_knob{knob="chunk_size",model_name=' in metrics
    assert 'knob="chunk_size",model_name="Llama-3-8B"} 64.0' in metrics


def test_an_idle_engine_reports_a_new_config_before_any_request(srv: LiveServer) -> None:
    res = _put(srv, {"token_budget": 256, "chunk_size": 128})
    assert res.status_code == 200, res.text
    # No request ran since: the scheduler and the gauges already hold the new knobs.
    assert srv.call(lambda e: e.scheduler.config.chunk_size) == 128
    metrics = httpx.get(srv.url + "/metrics").text
    assert 'knob="chunk_size",model_name="Llama-3-8B"} 128.0' in metrics
    assert 'knob="token_budget",model_name="Llama-3-8B"} 256.0' in metrics


@pytest.mark.parametrize(("body", "param", "words"), [
    ({"token_budget": 512, "chunk_size": 99999}, "chunk_size", "out of range"),
    ({"token_budget": 512, "no_such_knob": 1}, "no_such_knob", "unknown knob"),
    ({"token_budget": 512, "block_size": 32}, "block_size", "cannot change"),
    ({"token_budget": "many"}, "token_budget", "expected a whole number"),
    ({"preemption_mode": "pray"}, "preemption_mode", "recompute, swap, auto"),
    ({"token_budget": 256, "chunk_size": 512}, "chunk_size", "exceeds the token budget"),
    # int() read "5_12" as 512 and Arabic-Indic digits as 1024: a knob is a JSON number.
    ({"token_budget": "5_12"}, "token_budget", "as a JSON number, not a string"),
    ({"token_budget": "١٠٢٤"}, "token_budget", "as a JSON number, not a string"),
    ({"token_budget": 512.5}, "token_budget", "expected a whole number"),
    ({"enable_prefix_caching": "off"}, "enable_prefix_caching", "as a JSON boolean"),
])
def test_bad_put_changes_nothing(srv: LiveServer, body: dict[str, Any], param: str,
                                 words: str) -> None:
    before = _get(srv)
    res = _put(srv, body)
    assert res.status_code == 400, res.text
    err = res.json()["error"]
    assert err["param"] == param and words in err["message"]
    assert _get(srv) == before
    assert srv.call(lambda e: e.scheduler.config.to_dict()) == before


def test_an_integral_json_number_is_the_integer(srv: LiveServer) -> None:
    # 512.0 is how some JSON writers spell 512 (JSON Schema's integer counts it).
    res = _put(srv, {"token_budget": 512.0, "chunk_size": 256})
    assert res.status_code == 200, res.text
    assert res.json()["token_budget"] == 512 and _get(srv)["token_budget"] == 512
    assert isinstance(srv.call(lambda e: e.scheduler.config.token_budget), int)


def test_unchanged_non_live_knob_is_accepted(srv: LiveServer) -> None:
    res = _put(srv, {"block_size": 16, "max_num_seqs": 8})
    assert res.status_code == 200 and res.json()["max_num_seqs"] == 8


@pytest.mark.parametrize("body", [b"[1, 2]", b"{oops", b"", b"42"])
def test_put_body_must_be_an_object(srv: LiveServer, body: bytes) -> None:
    res = _put(srv, body)
    assert res.status_code == 400
    assert "error" in res.json()


def test_a_put_body_cut_short_says_where_without_a_doubled_word(srv: LiveServer) -> None:
    res = _put(srv, b'{"token_budget": "5')
    assert res.status_code == 400, res.text
    assert res.json()["error"]["message"] == ("the body is not valid JSON: Unterminated "
                                              "string starting at position 17")


@pytest.mark.parametrize("body", [b"[" * 50_000, b'{"token_budget": ' + b"[" * 50_000],
                         ids=["body", "value"])
def test_a_put_nested_too_deep_is_a_400(srv: LiveServer, body: bytes) -> None:
    # Nested past the JSON parser's recursion depth, it was a 500 (RecursionError); 50k
    # levels is past any recursion limit and inside the admin body limit.
    before = _get(srv)
    res = _put(srv, body)
    assert res.status_code == 400, res.text
    assert "nested" in res.json()["error"]["message"]
    assert _get(srv) == before


@pytest.mark.parametrize("headers", [
    {}, {"Authorization": "Bearer wrong"}, {"Authorization": ADMIN_TOKEN},
    {"Authorization": f"Basic {ADMIN_TOKEN}"}], ids=["none", "wrong", "bare", "basic"])
@pytest.mark.parametrize("method", ["GET", "PUT", "OPTIONS", "POST", "DELETE"])
def test_every_admin_method_needs_the_token(srv: LiveServer, headers: dict[str, str],
                                            method: str) -> None:
    before = _get(srv)
    res = httpx.request(method, srv.admin_url + "/admin/config", json={"token_budget": 512},
                        headers=headers)
    assert res.status_code == 401
    assert res.json()["error"]["type"] == "authentication_error"
    assert res.headers["www-authenticate"] == "Bearer"
    assert "token_budget" not in res.text  # nothing about the config leaks
    assert _get(srv) == before


def test_the_admin_api_is_on_its_own_port_only(srv: LiveServer) -> None:
    assert srv.admin_url != srv.url
    for method in ("GET", "PUT", "OPTIONS"):
        res = httpx.request(method, srv.url + "/admin/config", headers=AUTH,
                            json={"token_budget": 512})
        assert res.status_code in (404, 405), (method, res.status_code)
    assert not [p for p in httpx.get(srv.url + "/openapi.json").json()["paths"]
                if p.startswith("/admin")]
    # ... and the admin port serves nothing but the admin API.
    assert httpx.get(srv.admin_url + "/v1/models", headers=AUTH).status_code == 404
    assert httpx.get(srv.admin_url + "/metrics", headers=AUTH).status_code == 404


def test_options_lists_every_method(srv: LiveServer) -> None:
    res = httpx.options(srv.admin_url + "/admin/config", headers=AUTH)
    assert res.status_code == 204
    assert {m.strip() for m in res.headers["allow"].split(",")} == {"GET", "PUT", "OPTIONS"}
    wrong = httpx.post(srv.admin_url + "/admin/config", headers=AUTH, json={})
    assert wrong.status_code == 405 and "PUT" in wrong.headers["allow"]


def test_shared_port_admin_still_needs_the_token_for_get() -> None:
    with start_server(admin_token=ADMIN_TOKEN) as shared:
        assert httpx.get(shared.url + "/admin/config").status_code == 401
        assert httpx.get(shared.url + "/admin/config", headers=AUTH).status_code == 200


def test_a_server_given_only_the_digest_admits_the_token_and_nothing_else() -> None:
    # What the operator's pods get: the digest in their template, no Secret.
    digest = token_sha256(ADMIN_TOKEN)
    with start_server(admin_token=AdminCredential.of_digest(digest), admin_port=0) as srv:
        assert httpx.get(srv.admin_url + "/admin/config", headers=AUTH).status_code == 200
        for given in (digest, digest.upper(), "wrong"):
            res = httpx.get(srv.admin_url + "/admin/config",
                            headers={"Authorization": f"Bearer {given}"})
            assert res.status_code == 401, given


def test_serve_reads_the_token_or_its_digest_from_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLOPILOT_ADMIN_TOKEN", raising=False)
    monkeypatch.setenv("SLOPILOT_ADMIN_TOKEN_SHA256", token_sha256(ADMIN_TOKEN).upper())
    credential = admin_token(None)
    assert isinstance(credential, AdminCredential) and credential.admits(ADMIN_TOKEN)
    monkeypatch.setenv("SLOPILOT_ADMIN_TOKEN", ADMIN_TOKEN)
    with pytest.raises(ValueError, match=r"SLOPILOT_ADMIN_TOKEN_SHA256.*both"):
        admin_token(None)
    monkeypatch.delenv("SLOPILOT_ADMIN_TOKEN")
    monkeypatch.setenv("SLOPILOT_ADMIN_TOKEN_SHA256", "not-a-digest")
    with pytest.raises(ValueError, match=r"SLOPILOT_ADMIN_TOKEN_SHA256: expected .* 64 hex"):
        admin_token(None)


def test_the_digest_of_an_empty_token_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """``printf %s "$TOKEN" | sha256sum`` with TOKEN unset gives the empty string's digest:
    taken, it admitted ``Authorization: Bearer`` with nothing after it, and anyone who
    reached the admin port could set ``max_num_seqs`` to 1. Refused, as the client keys'
    digests are (clients.py) and an empty ``--admin-token-file``."""
    monkeypatch.delenv("SLOPILOT_ADMIN_TOKEN", raising=False)
    monkeypatch.setenv("SLOPILOT_ADMIN_TOKEN_SHA256", token_sha256("").upper())
    with pytest.raises(ValueError, match=r"SLOPILOT_ADMIN_TOKEN_SHA256: .*empty token"):
        admin_token(None)


def test_admin_without_a_configured_token_is_403() -> None:
    with start_server(admin_port=0) as srv:
        for method in ("GET", "PUT"):
            res = httpx.request(method, srv.admin_url + "/admin/config",
                                json={"token_budget": 512},
                                headers={"Authorization": "Bearer anything"})
            assert res.status_code == 403
            assert "SLOPILOT_ADMIN_TOKEN" in res.json()["error"]["message"]
        assert srv.call(lambda e: e.config.token_budget) == 1024


def test_prefix_caching_switched_off_live_is_off_everywhere(srv: LiveServer) -> None:
    res = _put(srv, {"enable_prefix_caching": False})
    assert res.status_code == 200 and res.json()["enable_prefix_caching"] is False
    assert srv.call(lambda e: e.scheduler.kv.enable_prefix_caching) is False
    assert 'enable_prefix_caching="false"' in httpx.get(srv.url + "/metrics").text
    assert _put(srv, {"enable_prefix_caching": True}).status_code == 200
    assert srv.call(lambda e: e.scheduler.kv.enable_prefix_caching) is True


def test_a_put_to_a_dead_engine_says_so() -> None:
    """After the engine loop failed, a PUT answered the generic "internal error
    (incident ...)" and logged a traceback as for a bug in the server; the inference
    routes answer engine_dead, which says to restart the server."""
    backend = build_backend(realtime=False)

    def broken(out: SchedulerOutput) -> Any:
        raise RuntimeError("device lost")

    backend.engine.executor.execute = broken  # type: ignore[method-assign]
    with start_server(backend, admin_token=ADMIN_TOKEN, admin_port=0) as srv:
        res = httpx.post(srv.url + "/v1/completions", json={"prompt": "hi"},
                         timeout=HANG_GUARD_S)
        assert res.status_code == 500
        wait_for(lambda: srv.engine.error is not None, what="the engine loop to fail")
        res = _put(srv, {"max_num_seqs": 8})
        assert res.status_code == 500, res.text
        err = res.json()["error"]
        assert err["code"] == "engine_dead" and "restart the server" in err["message"]


def test_an_admin_body_past_its_limit_is_a_413_read_no_further(srv: LiveServer) -> None:
    # A config patch is a few knobs. The public app caps bodies at 16 MiB; the admin app
    # had no cap, so one PUT could make the server read and parse any size.
    big = b'{"token_budget": 512, "pad": "' + b"x" * (2 << 20) + b'"}'
    res = _put(srv, big)
    assert res.status_code == 413, res.text
    assert "at most" in res.json()["error"]["message"]
    assert _put(srv, {"token_budget": 512}).status_code == 200
