"""client_truth's measuring, on streams whose timing is made up: vllm bench serve's rules
(TTFT at the first message with choices, an ITL for each later one, TPOT over the
usage's tokens), its SSE splitting, and the comparison with a scrape."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import h11
import pytest

from slopilot.engine.slo import SLOSpec

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import client_truth as ct


def _data(payload: object) -> str:
    return "data: " + json.dumps(payload)


ROLE = _data({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
USAGE = _data({"choices": [], "usage": {"completion_tokens": 3}})


def _tok(text: str) -> str:
    return _data({"choices": [{"index": 0, "delta": {"content": text}}]})


def test_vllm_bench_takes_ttft_at_the_first_message_with_choices() -> None:
    """A role chunk with no text is vLLM's client's first token; the usage chunk (no
    choices) neither ends the latency nor adds a gap; TPOT spreads the time after the
    first over the usage's other tokens."""
    got = ct.vllm_timings([(1.0, ROLE), (1.5, _tok("a")), (1.75, _tok("bc")),
                           (1.8, USAGE), (1.8, "data: [DONE]")], sent=0.5)
    assert got.status == "ok"
    assert got.ttft == pytest.approx(0.5)
    assert got.itl == pytest.approx([0.5, 0.25])
    assert got.latency == pytest.approx(1.25)
    assert got.output_tokens == 3
    assert got.tpot == pytest.approx(0.75 / 2)


def test_a_stream_without_choices_failed() -> None:
    assert ct.vllm_timings([(1.0, USAGE), (1.0, "data: [DONE]")], sent=0.0).status == "failed"


def test_sse_messages_split_as_vllm_splits_them() -> None:
    """On blank lines; a last message with none once it is whole JSON or [DONE]; a
    message cut mid-JSON waits for its rest."""
    sse = ct.SSEMessages()
    assert sse.add(b'data: {"a": 1}\n\ndata: {"b"') == ['data: {"a": 1}']
    assert sse.add(b': 2}') == ['data: {"b": 2}']
    assert sse.add(b"data: [DONE]") == ["data: [DONE]"]


def test_a_client_judges_a_request_on_its_own_ttft_and_gaps() -> None:
    slo = SLOSpec.from_dict(ct.SLO).class_slo(ct.CLASS)
    assert slo.ttft_p99_ms is not None and slo.tbt_p99_ms is not None
    fast = ct.Measured(status="ok", ttft=0.1, itl=[0.01] * 99)
    assert fast.met(slo)
    one_slow = ct.Measured(status="ok", ttft=0.1, itl=[0.01] * 99 + [1.0])
    assert one_slow.met(slo)  # 1 of 100: within 1 %
    assert not ct.Measured(status="ok", ttft=0.1, itl=[0.01] * 98 + [1.0, 1.0]).met(slo)
    assert not ct.Measured(status="ok", ttft=1.0, itl=[0.01]).met(slo)
    assert not ct.Measured(status="refused").met(slo)


def test_compare_reads_the_servers_increase_and_counts_a_429_never_served() -> None:
    """The server's figures are the scrape's increase over the phase; a refused request
    is a first token never given on both sides (+Inf)."""
    slo = SLOSpec.from_dict(ct.SLO).class_slo(ct.CLASS)
    cls = ("priority_class", ct.CLASS)

    def bucket(name: str, le: str) -> tuple[str, tuple[tuple[str, str], ...]]:
        return (f"{name}_bucket", (("le", le), cls))

    before = {bucket(ct.TTFT, "0.1"): 5.0, bucket(ct.TTFT, "+Inf"): 5.0}
    after = {bucket(ct.TTFT, "0.05"): 0.0, bucket(ct.TTFT, "0.1"): 7.0,
             bucket(ct.TTFT, "+Inf"): 7.0, (ct.REFUSED, (cls,)): 1.0,
             bucket(ct.ITL, "0.01"): 4.0, bucket(ct.ITL, "+Inf"): 4.0}
    records = [ct.Measured(status="ok", ttft=0.1, itl=[0.01, 0.01], latency=0.12,
                           output_tokens=3)] * 2 + [ct.Measured(status="refused")]
    f = ct.compare(records, before, after, slo)
    assert (f["requests"], f["ok"], f["refused"], f["server_refused"]) == (3, 2, 1, 1)
    assert f["ttft_p99_client_ms"] == math.inf
    assert f["ttft_p50_server_ms"] == pytest.approx(50 + 50 * 0.75)  # rank 1.5 of 2
    assert f["client_met"] == 2


def test_the_stops_requests_are_sent_inside_the_stop() -> None:
    """Evenly, the first after the stop began and the last before it ends."""
    assert ct.spread(4, 1.0) == pytest.approx([0.125, 0.375, 0.625, 0.875])
    assert all(0 < at < 2.0 for at in ct.spread(7, 2.0))


def test_kernel_prompts_are_drawn_again_from_their_seed() -> None:
    assert ct.prompts(5, 3) == ct.prompts(5, 3)
    assert ct.prompts(5, 3) != ct.prompts(5, 4)
    assert {len(p.split()) for p in ct.prompts(40, 1)} == {30, 600}


def test_kernel_compare_sets_the_servers_mean_against_the_clients_and_its_wire() -> None:
    """The server's mean is its histogram's sum over count, increase over the phase; the
    wire's client TTFT leaves out the client's own time before its write and after its
    kernel got the first chunk; a failed request is no client's TTFT."""
    cls = ("priority_class", ct.CLASS)

    def bucket(le: str) -> tuple[str, tuple[tuple[str, str], ...]]:
        return (f"{ct.TTFT}_bucket", (("le", le), cls))

    before = {(f"{ct.TTFT}_sum", (cls,)): 10.0, (f"{ct.TTFT}_count", (cls,)): 4.0,
              bucket("0.5"): 4.0, bucket("1.0"): 4.0, bucket("+Inf"): 4.0}
    after = {(f"{ct.TTFT}_sum", (cls,)): 11.5, (f"{ct.TTFT}_count", (cls,)): 6.0,
             bucket("0.5"): 4.0, bucket("1.0"): 6.0, bucket("+Inf"): 6.0}
    records = [ct.Measured(status="ok", ttft=0.8, written=0.05, read_lag=0.02),
               ct.Measured(status="ok", ttft=1.0, written=0.15), ct.Measured()]
    f = ct.kernel_compare(records, before, after)
    assert (f["requests"], f["ok"], f["server_count"]) == (3, 2, 2)
    assert f["ttft_mean_client_ms"] == pytest.approx(900)
    assert f["ttft_mean_server_ms"] == pytest.approx(750)
    assert f["ttft_mean_err"] == pytest.approx(-150 / 900)
    assert f["read_lag_mean_ms"] == pytest.approx(10)  # a lag the kernel never told: 0
    assert f["ttft_wire_client_ms"] == pytest.approx(790)
    assert f["ttft_wire_err"] == pytest.approx(-40 / 790)
    # From its last byte written: less only its own time before the write.
    assert f["ttft_sent_client_ms"] == pytest.approx(800)
    assert f["ttft_sent_err"] == pytest.approx(-50 / 800)
    assert f["ttft_p50_client_ms"] == pytest.approx(900)
    assert f["ttft_p50_server_ms"] == pytest.approx(750)  # rank 1 of 2 in (0.5, 1.0]
    # The client's two on the server's edges read as the server's buckets do.
    assert f["ttft_p50_bucketed_client_ms"] == pytest.approx(750)
    assert f["ttft_p50_bucketed_err"] == pytest.approx(0.0)


def test_an_uploads_first_piece_holds_its_head_and_part_of_its_body_only() -> None:
    """A server (h11's) has the head from the first piece but the request whole only
    with the second: the pause falls mid-body."""
    payload = {"model": "m", "prompt": "w1 w2 w3", "stream": True}
    first, rest = ct.upload_pieces(h11.Connection(h11.CLIENT), "host:1", payload)
    server = h11.Connection(h11.SERVER)
    server.receive_data(first)
    head = server.next_event()
    assert isinstance(head, h11.Request) and head.target == b"/v1/completions"
    got = b""
    while isinstance(event := server.next_event(), h11.Data):
        got += event.data
    assert event is h11.NEED_DATA and 0 < len(got) < len(json.dumps(payload))
    server.receive_data(rest)
    while isinstance(event := server.next_event(), h11.Data):
        got += event.data
    assert isinstance(event, h11.EndOfMessage) and json.loads(got) == payload


def _response_reads(lags: list[float | None]) -> ct.Measured:
    """An upload's response read in pieces (the head, then one SSE message a read, then
    the end), each read with its kernel ``lag``, on a clock a read apart."""
    server = h11.Connection(h11.SERVER)
    client = h11.Connection(h11.CLIENT)
    request = client.send(h11.Request(method="POST", target="/v1/completions",
                                      headers=[("Host", "h"), ("Content-Length", "0")]))
    client.send(h11.EndOfMessage())
    server.receive_data(request or b"")
    server.next_event()
    server.next_event()
    reads = [server.send(h11.Response(status_code=200, headers=[
        ("Transfer-Encoding", "chunked")])) or b""]
    reads += [server.send(h11.Data(data=(m + "\n\n").encode())) or b""
              for m in (_data({"choices": [{"text": t}]}) for t in ("a", "b"))]
    reads.append(server.send(h11.EndOfMessage()) or b"")
    assert len(reads) == len(lags)
    ticks = iter(range(10))
    response = ct.UploadResponse(client, sent=0.0, written=0.5,
                                 clock=lambda: float(next(ticks)))
    got = None
    for data, lag in zip(reads, lags, strict=True):
        got = response.add(data, lag)
    assert got is not None
    return got


def test_an_uploads_read_lag_is_its_first_body_reads_even_when_zero() -> None:
    """The kernel's lag at the read of the first body bytes, 0 where the client read
    them within the kernel's tick: not a later read's (the first tick past) instead."""
    got = _response_reads([0.0, 0.0, 0.004, 0.0])
    assert got.status == "ok" and got.written == pytest.approx(0.5)
    assert got.read_lag == 0.0
    assert _response_reads([0.0, 0.008, 0.004, 0.0]).read_lag == pytest.approx(0.008)


def test_an_uploads_read_lag_the_kernel_never_told_is_unknown() -> None:
    assert math.isnan(_response_reads([None, None, None, None]).read_lag)


def _ttft_series(metric: str, total_s: float, count: float,
                 labels: tuple[tuple[str, str], ...] = ()) -> ct.Samples:
    cls = (*labels, ("priority_class", ct.CLASS))
    return {(f"{metric}_sum", cls): total_s, (f"{metric}_count", cls): count,
            (f"{metric}_bucket", (*cls, ("le", "1.0"))): count,
            (f"{metric}_bucket", (*cls, ("le", "+Inf"))): count}


def test_kernel_compare_reads_the_meters_client_side_ttft_where_asked() -> None:
    """The meter's ``slopilot_client_*`` histogram (its model_name label summed over),
    not the server's series beside it in the same samples."""
    model = (("model_name", "m"),)
    after = (_ttft_series(ct.CLIENT_TTFT, 1.2, 2.0, model)
             | _ttft_series(ct.TTFT, 0.2, 2.0))
    records = [ct.Measured(status="ok", ttft=0.6), ct.Measured(status="ok", ttft=0.6)]
    meter = ct.kernel_compare(records, {}, after, ct.CLIENT_TTFT)
    assert meter["server_count"] == 2
    assert meter["ttft_mean_server_ms"] == pytest.approx(600)
    assert meter["ttft_mean_err"] == pytest.approx(0.0)
    assert ct.kernel_compare(records, {}, after)["ttft_mean_server_ms"] == pytest.approx(100)


def test_kernel_runs_gives_each_reading_its_row_from_its_own_scrapes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A phase's requests, sent once, set against every reading: the meter's histogram
    from the meter's scrapes and the server's behind it from the server's, each row
    its ``PHASE_ROW`` and a run each."""
    scrapes = {"meter": [_ttft_series(ct.CLIENT_TTFT, 0.0, 0.0),
                         _ttft_series(ct.CLIENT_TTFT, 1.0, 2.0)],
               "server": [_ttft_series(ct.TTFT, 0.0, 0.0), _ttft_series(ct.TTFT, 0.4, 2.0)]}
    sent: list[tuple[str, str]] = []

    def phase(name: str, url: str, model: str, args: object, seed: int,
              scraped: list[str]) -> tuple[list[ct.Samples], list[ct.Measured]]:
        sent.append((name, url))
        return ([scrapes[u][0] for u in scraped],
                [ct.Measured(status="ok", ttft=0.5, written=0.0)] * 2)

    async def warm(*_: object) -> None:
        sent.append(("warm", ""))

    monkeypatch.setattr(ct, "kernel_phase", phase)
    monkeypatch.setattr(ct, "burst", warm)
    monkeypatch.setattr(ct, "scrape_all", lambda urls: [scrapes[u][1] for u in urls])
    figures: dict[str, list[dict[str, float]]] = {}
    args = argparse.Namespace(runs=2, seed=1)
    ct.kernel_runs(args, "meter", "m", (ct.Reading("meter", "meter", ct.CLIENT_TTFT),
                                        ct.Reading("behind", "server", ct.TTFT)), figures)
    assert sent[0] == ("warm", "")
    assert sent[1:] == [(name, "meter") for name in ct.KERNEL_PHASES] * 2
    assert set(figures) == {f"{n}_{r}" for n in ct.KERNEL_PHASES for r in ("meter", "behind")}
    assert all(len(runs) == 2 for runs in figures.values())
    assert figures["burst_meter"][0]["ttft_mean_err"] == pytest.approx(0.0)
    assert figures["burst_behind"][0]["ttft_mean_server_ms"] == pytest.approx(200)
