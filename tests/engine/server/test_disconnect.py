"""A client that goes away aborts its request and frees its blocks."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.live_server import LiveServer, start_server
from tests.support.waits import HANG_GUARD_S, wait_for


@pytest.fixture(scope="module")
def srv() -> Iterator[LiveServer]:
    with start_server() as server:
        yield server


def _engine_empty(srv: LiveServer) -> bool:
    return srv.call(lambda e: not e.scheduler.requests and e.scheduler.kv.num_used_blocks == 0)


def _aborts(srv: LiveServer) -> float:
    text = httpx.get(srv.url + "/metrics").text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "vllm:request_success_total" and \
                    s.labels["finished_reason"] == "abort":
                return s.value
    return 0.0


def test_stream_disconnect_aborts_and_frees_blocks(srv: LiveServer) -> None:
    before = _aborts(srv)
    body = {"prompt": "w " * 100, "max_tokens": 5000, "stream": True, "ignore_eos": True}
    with httpx.Client(timeout=HANG_GUARD_S) as client, \
            client.stream("POST", srv.url + "/v1/completions", json=body) as res:
        lines = res.iter_lines()
        assert next(lines).startswith("data: ")
        assert srv.call(lambda e: e.scheduler.kv.num_used_blocks) > 0
    # Leaving both blocks closes the connection mid-stream.
    wait_for(lambda: _engine_empty(srv), what="the request to be aborted")
    assert _aborts(srv) == before + 1
    srv.call(lambda e: e.scheduler.check_integrity())


def test_non_streaming_disconnect_aborts(srv: LiveServer) -> None:
    before = _aborts(srv)
    body = {"prompt": "w " * 50, "max_tokens": 5000, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(srv.url + "/v1/completions", json=body, timeout=httpx.Timeout(30, read=0.5))
    wait_for(lambda: _engine_empty(srv), what="the request to be aborted")
    assert _aborts(srv) == before + 1
