"""The meter's client-side latency histograms: each stream's first token and token gaps
observed as they are written, on the test's clock (``test_meter``'s ``Client`` sets it to
each piece's write).

vLLM's own TTFT ends when its frontend processes the first engine output, and its token
gaps are the engine core's: they leave out detokenizing, serializing, the write and a
busy API server's event loop, and read low against what a client measures. The loop's
rules read these instead on a vLLM deployment.
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from slopilot.engine.histogram_quantiles import histogram_quantile
from slopilot.engine.latency_buckets import TOKEN_LATENCY_BUCKETS
from slopilot.engine.meter.client_latency import CLIENT_ABANDONED, CLIENT_TBT, CLIENT_TTFT
from slopilot.engine.meter.proxy import Meter
from slopilot.engine.slo import WITHIN_TTFT_TARGET
from slopilot.engine.verdicts import SLO_REQUESTS, SLO_TOKENS
from tests.engine.meter import vllm_wire as wire
from tests.engine.meter.test_meter import (
    DONE,
    HOLD,
    STREAM,
    Client,
    Upstream,
    event,
    meter_for,
    run,
)
from tests.support.waits import HANG_GUARD_S

Buckets = dict[float, float]
"""Cumulative counts by ``le`` (+Inf as ``math.inf``)."""


def exposition(body: bytes) -> dict[str, Any]:
    """The families of a /metrics answer, by name, as Prometheus' own parser reads it."""
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


def buckets(families: dict[str, Any], name: str) -> tuple[Buckets, float]:
    """``name``'s cumulative buckets and sum, the one series the meter exports."""
    family = families[name]
    series = {tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
              for s in family.samples}
    assert series == {(("model_name", "llama"), ("priority_class", "p0"))}, series
    out = {math.inf if s.labels["le"] == "+Inf" else float(s.labels["le"]): s.value
           for s in family.samples if s.name == name + "_bucket"}
    assert sorted(e for e in out if e != math.inf) == list(TOKEN_LATENCY_BUCKETS)
    total = next(s.value for s in family.samples if s.name == name + "_sum")
    return out, total


def counts_at(cumulative: Buckets, *edges: float) -> list[float]:
    return [cumulative[e] for e in edges]


async def scrape(meter: Meter, now: list[float]) -> dict[str, Any]:
    status, _, body = await Client(meter, now).request("GET", "/metrics")
    assert status == 200
    return exposition(body)


# Writes at binary fractions of a second: every TTFT and gap is exact, none on an edge.
# A first token 0.25 s after the request arrived (le 0.3), then gaps of 0.0625 (le 0.075),
# 0.375 (le 0.4) and 0.0625 s.
WRITES = [0.25, 0.3125, 0.6875, 0.75, 0.75]


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_first_token_and_gaps_are_observed_as_written(tmp_path: Path, chat: bool) -> None:
    upstream, now = Upstream(), [0.0]
    meter = meter_for(tmp_path, upstream, now)
    upstream.answer([event(text="a", chat=chat), event(text="b", chat=chat),
                     event(text="c", chat=chat), event(text="d", chat=chat, finish="stop"),
                     DONE])
    body: dict[str, Any] = ({"model": "llama", "messages": [], "stream": True} if chat
                            else STREAM)

    async def go() -> dict[str, Any]:
        await Client(meter, now).request(
            "POST", "/v1/chat/completions" if chat else "/v1/completions", body,
            written_at=WRITES)
        return await scrape(meter, now)

    families = run(go)
    ttft, ttft_sum = buckets(families, CLIENT_TTFT)
    assert counts_at(ttft, 0.2, 0.3, math.inf) == [0, 1, 1] and ttft_sum == 0.25
    gaps, gap_sum = buckets(families, CLIENT_TBT)
    assert counts_at(gaps, 0.05, 0.075, 0.3, 0.4, math.inf) == [0, 2, 2, 3, 3]
    assert gap_sum == 0.5


def test_a_long_streams_gaps_are_observed_before_it_ends_and_one_cut_short_keeps_them(
        tmp_path: Path) -> None:
    """Observed at the stream's end, an hour-long stream's gaps would all land in the
    rate window it ended in, not in the ones they were made in; and the client that
    leaves still saw its first token and gaps."""
    upstream, now = Upstream(), [0.0]
    meter = meter_for(tmp_path, upstream, now)
    upstream.answer([event(text="a"), event(text="b"), event(text="c"), HOLD])

    async def go() -> tuple[dict[str, Any], dict[str, Any]]:
        client = Client(meter, now)
        task = asyncio.ensure_future(client.request(
            "POST", "/v1/completions", {**STREAM, "max_tokens": 100},
            written_at=WRITES[:3]))
        while sum(1 for m in client.sent if m.get("body")) < 3:
            await asyncio.sleep(0)
        mid = await scrape(meter, now)
        now[0] = 5.0
        client.leave.set()  # cut short: the client goes away
        await asyncio.wait_for(task, HANG_GUARD_S)
        return mid, await scrape(meter, now)

    mid, after = run(go)
    for families in (mid, after):
        ttft, _ = buckets(families, CLIENT_TTFT)
        assert ttft[math.inf] == 1
        gaps, gap_sum = buckets(families, CLIENT_TBT)
        assert counts_at(gaps, 0.075, math.inf) == [1, 2] and gap_sum == 0.4375
    # Its 0.375 s gap was over 1 % of all 99 its max_tokens allow: judged a miss, after
    # the histograms had it.
    verdicts = {s.labels["met"]: s.value for s in after["slopilot_slo_requests"].samples
                if s.labels["priority_class"] == "p0"}
    assert verdicts == {"true": 0, "false": 1}


def test_each_choice_of_n_has_its_first_token_and_its_own_gaps(tmp_path: Path) -> None:
    upstream, now = Upstream(), [0.0]
    meter = meter_for(tmp_path, upstream, now)
    upstream.answer([event(text="a", index=0), event(text="a", index=1),
                     event(text="b", index=0), event(text="b", index=1, finish="stop"),
                     event(text="c", index=0, finish="stop"), DONE])

    async def go() -> dict[str, Any]:
        # Choice 0 written at 0.25, 0.5 and 0.75; choice 1 at 0.375 and 0.5625.
        await Client(meter, now).request("POST", "/v1/completions", {**STREAM, "n": 2},
                                         written_at=[0.25, 0.375, 0.5, 0.5625, 0.75, 0.75])
        return await scrape(meter, now)

    families = run(go)
    ttft, ttft_sum = buckets(families, CLIENT_TTFT)
    assert counts_at(ttft, 0.3, 0.4, math.inf) == [1, 2, 2] and ttft_sum == 0.625
    gaps, gap_sum = buckets(families, CLIENT_TBT)
    # Choice 1's gap is its own 0.1875 s, not the 0.0625 s since choice 0's token.
    assert counts_at(gaps, 0.075, 0.2, 0.3, math.inf) == [0, 1, 3, 3]
    assert gap_sum == 0.6875


def test_a_stall_whose_tokens_come_in_one_chunk_is_one_gap_in_the_exported_p99(
        tmp_path: Path) -> None:
    """vLLM's API server, its loop stalled 3 s, writes the 150 tokens it backed up in one
    chunk (its continuous usage says so). The client, as ``vllm bench serve``, times one
    gap a chunk: 81 here, one of them 3 s, and its P99 past 1 s. The meter observed the
    stall and 149 gaps of 0 (230, one a token): its P99 read 7.9 ms, under the SLO's
    100 ms target, and the stream met it."""
    upstream, now = Upstream(), [0.0]
    meter = meter_for(tmp_path, upstream, now)
    pieces, writes, at, tokens = [], [], 0.25, 0
    # 1/128 s apart, exact in binary: a first token, 60 more, the stall, 20 more.
    for n, wait in [(1, 0.0)] + [(1, 1 / 128)] * 60 + [(150, 3.0)] + [(1, 1 / 128)] * 20:
        at += wait
        tokens += n
        pieces.append(wire.completion(0, "a" * n, usage=(2, tokens)))
        writes.append(at)
    pieces += [wire.completion(0, "", finish="length", usage=(2, tokens)), wire.DONE]
    writes += [at, at]
    upstream.answer(pieces, headers={"content-type": wire.CONTENT_TYPE})

    async def go() -> dict[str, Any]:
        await Client(meter, now).request("POST", "/v1/completions",
                                         {**STREAM, "max_tokens": tokens},
                                         written_at=writes)
        return await scrape(meter, now)

    families = run(go)
    gaps, gap_sum = buckets(families, CLIENT_TBT)
    assert gaps[math.inf] == 81  # the chunks after the first, not the tokens
    assert gap_sum == 3.0 + 80 / 128
    assert histogram_quantile(0.99, gaps) > 1.0
    verdicts = {s.labels["met"]: s.value
                for s in families[SLO_TOKENS.removesuffix("_total")].samples
                if s.labels["priority_class"] == "p0" and s.name == SLO_TOKENS}
    assert verdicts == {"true": 0, "false": tokens}  # the tokens, from the usage


def test_a_body_not_streamed_observes_nothing(tmp_path: Path) -> None:
    upstream, now = Upstream(), [0.0]
    meter = meter_for(tmp_path, upstream, now)
    upstream.answer([b'{"choices": []}'], headers={"content-type": "application/json"})

    async def go() -> dict[str, Any]:
        await Client(meter, now).request("POST", "/v1/completions",
                                         {**STREAM, "stream": False}, written_at=[0.5])
        return await scrape(meter, now)

    families = run(go)
    for name in (CLIENT_TTFT, CLIENT_TBT):
        assert all(s.value == 0 for s in families[name].samples), name


def test_metrics_are_the_engines_then_the_verdicts_then_the_client_histograms(
        tmp_path: Path) -> None:
    upstream, now = Upstream(), [0.0]
    meter = meter_for(tmp_path, upstream, now)
    upstream.answer([event(text="a"), event(text="b", finish="stop"), DONE])

    async def go() -> bytes:
        await Client(meter, now).request("POST", "/v1/completions", STREAM,
                                         written_at=WRITES[:3])
        return (await Client(meter, now).request("GET", "/metrics"))[2]

    body = run(go)
    families = exposition(body)
    assert families["vllm:generation_tokens"].samples[0].value == 7
    assert families[CLIENT_TTFT].type == families[CLIENT_TBT].type == "histogram"
    text = body.decode()
    order = [text.index(f"# TYPE {name}") for name in
             ("vllm:generation_tokens_total", SLO_REQUESTS, SLO_TOKENS, CLIENT_TTFT,
              CLIENT_TBT)]
    assert order == sorted(order)
    assert buckets(families, CLIENT_TBT)[0][math.inf] == 1


def abandoned(families: dict[str, Any]) -> dict[tuple[str, str, str], float]:
    """``CLIENT_ABANDONED`` by (model_name, priority_class, within_ttft_target)."""
    family = families[CLIENT_ABANDONED.removesuffix("_total")]
    return {(s.labels["model_name"], s.labels["priority_class"],
             s.labels[WITHIN_TTFT_TARGET]): s.value
            for s in family.samples if s.name == CLIENT_ABANDONED}


def test_a_stream_cut_short_before_its_first_token_is_counted_as_never_given(
        tmp_path: Path) -> None:
    """vLLM queues what it cannot run and answers no 429: a client that gives up waiting
    is in no TTFT histogram, vLLM's nor the meter's. Counted here, per choice, the rules
    read it as a first token never given (``rules.bucket_rates``); uncounted, a stall in
    which no client got a first token read a NaN P99 and its alerts cleared."""
    upstream, now = Upstream(), [0.0]
    meter = meter_for(tmp_path, upstream, now)
    upstream.answer([HOLD])

    async def go() -> tuple[dict[str, Any], dict[str, Any]]:
        before = await scrape(meter, now)  # exported at 0 from the start
        client = Client(meter, now)
        task = asyncio.ensure_future(client.request("POST", "/v1/completions",
                                                    {**STREAM, "n": 3}))
        while not client.sent:  # the engine took it: its answer's head is written
            await asyncio.sleep(0)
        now[0] = 30.0
        client.leave.set()
        await asyncio.wait_for(task, HANG_GUARD_S)
        return before, await scrape(meter, now)

    before, after = run(go)
    assert abandoned(before) == {("", "p0", "false"): 0, ("", "p0", "true"): 0}
    # Each of its n choices, its client gone after 30 s: past P0's 500 ms target.
    assert abandoned(after) == {("", "p0", "false"): 3, ("", "p0", "true"): 0}
    ttft, _ = buckets_of(after, CLIENT_TTFT)
    assert ttft[math.inf] == 0


def test_a_client_gone_within_its_ttft_target_is_counted_apart(tmp_path: Path) -> None:
    """A client whose own timeout (15 ms) ended its stream before P0's target (500 ms)
    missed nothing: counted under within_ttft_target="true", which the rules do not read
    as a first token never given (a 300 s P99 and a retune for a client's timeout)."""
    upstream, now = Upstream(), [0.0]
    meter = meter_for(tmp_path, upstream, now)
    upstream.answer([HOLD])

    async def go() -> dict[str, Any]:
        client = Client(meter, now)
        task = asyncio.ensure_future(client.request("POST", "/v1/completions", STREAM))
        while not client.sent:
            await asyncio.sleep(0)
        now[0] = 0.015
        client.leave.set()
        await asyncio.wait_for(task, HANG_GUARD_S)
        return await scrape(meter, now)

    assert abandoned(run(go)) == {("", "p0", "false"): 0, ("", "p0", "true"): 1}


def test_only_the_choices_without_a_first_token_are_counted(tmp_path: Path) -> None:
    upstream, now = Upstream(), [0.0]
    meter = meter_for(tmp_path, upstream, now)
    upstream.answer([event(text="a", index=0), HOLD])

    async def go() -> dict[str, Any]:
        client = Client(meter, now)
        task = asyncio.ensure_future(client.request(
            "POST", "/v1/completions", {**STREAM, "n": 2}, written_at=[0.25]))
        while sum(1 for m in client.sent if m.get("body")) < 1:
            await asyncio.sleep(0)
        client.leave.set()
        await asyncio.wait_for(task, HANG_GUARD_S)
        # A stream served whole counts none.
        upstream.answer([event(text="a"), event(text="b", finish="stop"), DONE])
        await Client(meter, now).request("POST", "/v1/completions", STREAM,
                                         written_at=WRITES[:3])
        return await scrape(meter, now)

    families = run(go)
    # Its client left at once: within its target.
    assert abandoned(families) == {("llama", "p0", "false"): 0, ("llama", "p0", "true"): 1}
    ttft, _ = buckets(families, CLIENT_TTFT)
    assert ttft[math.inf] == 2


def buckets_of(families: dict[str, Any], name: str) -> tuple[Buckets, float]:
    """``buckets`` of a meter whose streams named no model yet."""
    family = families[name]
    out = {math.inf if s.labels["le"] == "+Inf" else float(s.labels["le"]): s.value
           for s in family.samples if s.name == name + "_bucket"}
    return out, next(s.value for s in family.samples if s.name == name + "_sum")
