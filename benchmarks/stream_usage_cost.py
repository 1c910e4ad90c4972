"""What a stream's usage costs the server's writer: CPU time per SSE chunk, by stream_options.

The built-in server's chunk writer (``responses.sse_events``) on the simulated backend,
one token a delta (so one chunk a token, the hot path of a stream), the engine replaced by
pushes on the writer's own loop: what is timed is reading a delta, detokenizing it,
building and serializing its chunk, and the bookkeeping after the write, for every token
but the first (whose chunk a chat stream's role chunk goes out with). No socket, no
engine thread: each token is pushed before its chunk is read. Variants: no
``stream_options``, ``include_usage`` (the last chunk only), and
``continuous_usage_stats`` (a usage object on every chunk), for completions and chat,
interleaved round by round so a busy machine slows each alike; the median of the rounds'
per-chunk times is reported.

    .venv/bin/python benchmarks/stream_usage_cost.py [--rounds 7] [--tokens 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
from collections.abc import AsyncIterator, Coroutine
from typing import Any, cast

from slopilot.engine.config import EngineConfig
from slopilot.engine.request import FinishReason
from slopilot.engine.server.backends import Backend, build_simulated
from slopilot.engine.server.logprobs_format import TokenText
from slopilot.engine.server.protocol import ChatCompletionRequest, CompletionRequest
from slopilot.engine.server.request_stream import RequestStream
from slopilot.engine.server.responses import Delivery, sse_events
from slopilot.engine.server.serving import prepare

TOKEN = 7
OPTIONS: dict[str, dict[str, Any] | None] = {
    "none": None,
    "include_usage": {"include_usage": True},
    "continuous": {"include_usage": True, "continuous_usage_stats": True},
}


class _NoEngine:
    def abort(self, request_id: str, *, stopped: bool = False) -> None:
        del request_id, stopped


def next_chunk(events: AsyncIterator[str]) -> str:
    """The writer's next chunk, which must be ready now.

    Every token is pushed before its chunk is read, so a writer that waits is waiting
    for something this script never pushes: refused, where awaiting it would hang."""
    step = cast("Coroutine[Any, Any, str]", events.__anext__())
    try:
        step.send(None)
    except StopIteration as done:
        return cast(str, done.value)
    step.close()
    raise RuntimeError("the writer waited for something this script never pushes "
                       "(has the order of its chunks changed?)")


async def _per_chunk_s(backend: Backend, body: CompletionRequest | ChatCompletionRequest,
                       tokens: int) -> float:
    """Seconds of CPU per chunk to write a stream of ``tokens`` one-token chunks, the
    first left out: a chat stream's role chunk goes out with it (``sse_events``)."""
    prep = prepare(backend, body, {}, arrival_time=0.0)
    stream = RequestStream(prep.choices[0].request, _NoEngine())
    delivery = Delivery(backend, prep, [stream], time.perf_counter, slo=None)
    events = sse_events(delivery, TokenText(backend.tokenizer))

    def push(i: int) -> None:
        stream._push(TOKEN, FinishReason.LENGTH if i == tokens - 1 else None)

    push(0)
    if prep.chat:
        next_chunk(events)  # the role chunk, written with the first token's
    next_chunk(events)
    start = time.thread_time()
    for i in range(1, tokens):
        push(i)
        next_chunk(events)
    with contextlib.suppress(StopAsyncIteration):
        while True:  # the usage chunk if asked for, [DONE]
            next_chunk(events)
    return (time.thread_time() - start) / (tokens - 1)


def _body(api: str, options: dict[str, Any] | None, tokens: int
          ) -> CompletionRequest | ChatCompletionRequest:
    common: dict[str, Any] = {"max_tokens": tokens, "stream": True, "ignore_eos": True,
                              "stream_options": options}
    if api == "chat":
        return ChatCompletionRequest.model_validate(
            {"messages": [{"role": "user", "content": "hello there"}], **common})
    return CompletionRequest.model_validate({"prompt": "hello there", **common})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--tokens", type=int, default=2000,
                    help="chunks per stream, the first not timed (at least 2)")
    args = ap.parse_args()
    if args.tokens < 2:
        ap.error(f"--tokens {args.tokens}: the first chunk is not timed, so at least 2")
    backend = build_simulated(EngineConfig(), realtime=False)
    results: dict[str, dict[str, list[float]]] = {
        api: {name: [] for name in OPTIONS} for api in ("completions", "chat")}
    for _ in range(args.rounds + 1):  # the first round warms up, and is dropped
        for api, by_option in results.items():
            for name, options in OPTIONS.items():
                body = _body(api, options, args.tokens)
                by_option[name].append(asyncio.run(_per_chunk_s(backend, body,
                                                                args.tokens)))
    figures: list[str] = []
    for api, by_option in results.items():
        base = statistics.median(by_option["none"][1:])
        for name, runs in by_option.items():
            us = statistics.median(runs[1:]) * 1e6
            figures.append(f"{api}_{name}_us_per_chunk={us:.2f}")
            print(f"{api:12s} {name:14s} {us:7.2f} us/chunk  "
                  f"({us / (base * 1e6) - 1:+.1%} against none)")
    print("RESULT " + " ".join(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
