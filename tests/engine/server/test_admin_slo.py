"""/admin/slo: the objectives the server judges each request by, read and replaced live
behind the admin token (the operator keeps them on the deployment's spec.slo)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from slopilot.engine.request import Priority
from slopilot.engine.slo import SLOSpec
from tests.engine.server.conftest import ADMIN_TOKEN
from tests.support.live_server import LiveServer, start_server
from tests.support.waits import HANG_GUARD_S, wait_for

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.fixture
def srv() -> Iterator[LiveServer]:
    with start_server(admin_token=ADMIN_TOKEN, admin_port=0) as server:
        yield server


def _slo(srv: LiveServer, method: str = "GET", body: Any = None,
         headers: dict[str, str] | None = None) -> httpx.Response:
    kw: dict[str, Any] = {"content": body} if isinstance(body, bytes) else (
        {"json": body} if body is not None else {})
    return httpx.request(method, srv.admin_url + "/admin/slo", headers=headers or AUTH,
                         timeout=HANG_GUARD_S, **kw)


def test_a_put_slo_is_what_requests_are_judged_by_from_then_on(srv: LiveServer) -> None:
    res = _slo(srv)
    assert res.status_code == 200 and res.json() is None  # none given: nothing judged
    strict = {"profile": "strict", "classes": {"p0": {"ttftP99Ms": 80}}}
    res = _slo(srv, "PUT", strict)
    assert res.status_code == 200, res.text
    want = SLOSpec.from_dict(strict)
    assert res.json() == want.to_dict() == _slo(srv).json()
    assert srv.backend.metrics.slo == want
    assert srv.backend.metrics.slo.p0 == want.p0


@pytest.mark.parametrize(("body", "words", "param"), [
    ({"classes": {"p0": {"ttftP99Ms": -1}}}, "classes.p0.ttft_p99_ms=-1",
     "classes.p0.ttft_p99_ms"),
    ({"classes": {"p1": {"latency": 5}}}, "classes.p1.latency: unknown objective",
     "classes.p1.latency"),
    ({"classes": {"p9": {}}}, "classes.p9: not a class", "classes.p9"),
    ({"classes": [1]}, "classes: expected a mapping", "classes"),
    ({"profile": "fastest"}, "profile='fastest': unknown SLO profile", "profile"),
    ({"prefixHitMin": 2}, "prefix_hit_min=2: expected a ratio", "prefix_hit_min"),
    ({"ttft": 5}, "unknown SLO field(s) 'ttft'", "ttft"),
    ([1, 2], "must be a JSON object of objectives", None),
    (b"{not json", "not valid JSON", None),
    (b"[" * 50_000, "nested too deeply", None),  # past any recursion limit, < 64 KiB
], ids=["negative", "no-such-objective", "no-such-class", "classes-a-list",
        "no-such-profile", "shared-out-of-range", "no-such-field", "a-list", "not-json",
        "deep"])
def test_a_bad_slo_is_a_400_that_says_why_and_changes_nothing(
        srv: LiveServer, body: Any, words: str, param: str | None) -> None:
    """``param`` names the field the message names, as /admin/config's does (it was
    null for every field)."""
    before = SLOSpec.from_profile("relaxed")
    assert _slo(srv, "PUT", before.to_dict()).status_code == 200
    res = _slo(srv, "PUT", body)
    assert res.status_code == 400, res.text
    assert words in res.json()["error"]["message"]
    assert res.json()["error"]["param"] == param
    assert srv.backend.metrics.slo == before


def test_the_slo_needs_the_token_like_every_admin_path(srv: LiveServer) -> None:
    for method, body in (("GET", None), ("PUT", {"profile": "strict"})):
        res = _slo(srv, method, body, headers={"Authorization": "Bearer wrong"})
        assert res.status_code == 401
    assert srv.backend.metrics.slo is None


def test_serve_judges_by_the_slo_file_it_was_started_with(tmp_path: Any) -> None:
    import json

    from slopilot.engine.server.commands import load_slo_file

    path = tmp_path / "slo.json"
    path.write_text(json.dumps({"profile": "strict"}))
    assert load_slo_file(path) == SLOSpec.from_profile("strict")
    path.write_text('{"classes": {"p1": {"tbtP99Ms": 0}}}')
    with pytest.raises(ValueError, match=r"--slo .*slo.json: classes.p1.tbt_p99_ms=0"):
        load_slo_file(path)
    with pytest.raises(ValueError, match=r"--slo .*missing.json: no such file"):
        load_slo_file(tmp_path / "missing.json")
    path.write_text("[")
    with pytest.raises(ValueError, match=r"--slo .*slo.json: not valid JSON"):
        load_slo_file(path)


def test_serve_reads_the_slo_file_named_by_the_environment(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the operator's pods get: the ConfigMap's slo.json, named by $SLOPILOT_SLO_FILE
    (an image too old to know it ignores it; --slo would stop it starting)."""
    import argparse

    from slopilot.engine.server import commands
    from slopilot.engine.slo import SLO_FILE_ENV

    (tmp_path / "slo.json").write_text('{"profile": "relaxed"}')
    monkeypatch.setenv(SLO_FILE_ENV, str(tmp_path / "slo.json"))
    seen: list[Any] = []
    monkeypatch.setattr("slopilot.engine.server.uvicorn_runner.serve_forever",
                        lambda backend, **kw: seen.append(backend.metrics.slo) or 0)
    parser = argparse.ArgumentParser()
    commands.register(parser.add_subparsers())
    args = parser.parse_args(["serve", "--executor", "simulated"])
    assert args.func(args) == 0
    assert seen == [SLOSpec.from_profile("relaxed")]
    monkeypatch.setenv(SLO_FILE_ENV, str(tmp_path / "gone.json"))
    assert args.func(args) == 2  # named, and refused before anything starts


def test_a_request_waiting_for_admission_is_judged_by_the_slo_of_its_arrival(
        srv: LiveServer) -> None:
    """An SLO replaced while a request that already arrived waits to be admitted (the
    engine thread takes it between two iterations) applies from the next request on.
    The request was judged by the new objectives, taken when its admission came back:
    it arrived under a 500 ms P1 TTFT and was counted under the strict profile's."""
    old, new = SLOSpec.from_profile("standard"), SLOSpec.from_profile("strict")
    assert old.p1.label != new.p1.label
    assert _slo(srv, "PUT", old.to_dict()).status_code == 200
    gate = threading.Event()
    # The engine thread is held in a command, as in a long iteration: the request's
    # admission queues behind it.
    held = asyncio.run_coroutine_threadsafe(srv.engine.call(lambda e: gate.wait()),
                                            srv.loop)
    body = {"prompt": "one two three", "max_tokens": 2, "ignore_eos": True}
    with ThreadPoolExecutor(1) as pool:
        sent = pool.submit(httpx.post, srv.url + "/v1/completions", json=body,
                           timeout=HANG_GUARD_S)
        wait_for(lambda: srv.engine.num_active == 1, what="the request to await admission")
        assert _slo(srv, "PUT", new.to_dict()).status_code == 200
        gate.set()
        held.result(HANG_GUARD_S)
        assert sent.result(HANG_GUARD_S).status_code == 200
    wait_for(lambda: any(v != (0, 0) for v in srv.backend.metrics.verdicts().values()),
             what="the request to be judged")
    # Judged by the old objectives; whether it met them is the machine's speed (a 500 ms
    # TTFT on the wall clock, through an engine thread held for an HTTP round trip).
    counted = {(cls, label): v for (cls, label, _met), v in
               srv.backend.metrics.verdicts().items() if v != (0, 0)}
    assert counted == {(Priority.P1, old.p1.label): (1, 2)}
