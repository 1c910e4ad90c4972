"""The meter in front of the built-in engine's server: the continuous usage it asks every
stream for is written (so a chunk's tokens are what it says, not one a chunk), and taken
back out of what the client gets, byte for byte.

The server's chunks here come from its own writer with the tokens arriving on a script
(``scripted_stream``), so which tokens share a chunk is fixed: the same script written
for the client's own request and for the meter's ask must agree to the byte once the
meter took out what the client did not ask for.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from slopilot.engine.meter.stream_judge import StreamJudge, Verdict
from slopilot.engine.meter.usage_stats import Asked, UsageStrip, ask, asked
from slopilot.engine.request import FinishReason
from slopilot.engine.server.backends import Backend
from slopilot.engine.slo import ClassSLO
from tests.support.live_server import build_backend
from tests.support.scripted_stream import Push, written

LENGTH = FinishReason.LENGTH
CHAT: dict[str, Any] = {"messages": [{"role": "user", "content": "a b"}], "max_tokens": 4,
                        "stream": True}
COMPLETION: dict[str, Any] = {"prompt": "a b", "max_tokens": 4, "stream": True}
# Choice 0 gets one token, then two merged, then its last; choice 1 three merged, then one.
MERGED: list[list[Push]] = [[(0, 1), (1, 3)], [(0, 2)], [(0, 1, LENGTH), (1, 1, LENGTH)]]
ONE_CHOICE: list[list[Push]] = [[(0, 1)], [(0, 3)], [(0, 1, LENGTH)]]
# Each request's own: its id and the second it was made.
_PER_REQUEST = re.compile(rb'"(?:chat)?cmpl-[0-9a-f]+"|"created":\d+')


@pytest.fixture(scope="module")
def backend() -> Backend:
    return build_backend(realtime=False)


def _same_request(raw: bytes) -> bytes:
    return _PER_REQUEST.sub(b"_", raw)


@pytest.mark.parametrize("options", [
    None, {}, {"include_usage": True}, {"include_usage": False}, {"include_usage": None},
    {"include_usage": True, "continuous_usage_stats": False}],
    ids=["none", "empty", "final", "no-usage", "null", "final-not-continuous"])
@pytest.mark.parametrize(("body", "script"), [
    (COMPLETION, ONE_CHOICE), ({**COMPLETION, "n": 2}, MERGED),
    ({**COMPLETION, "prompt": ["a", "a b c"]}, MERGED),
    (CHAT, ONE_CHOICE), ({**CHAT, "n": 2}, MERGED)],
    ids=["completions", "completions-n2", "completions-batch", "chat", "chat-n2"])
def test_the_client_gets_the_bytes_it_would_have_had_without_the_meter(
        backend: Backend, body: dict[str, Any], script: list[list[Push]],
        options: dict[str, Any] | None) -> None:
    """What the meter sends the server (``ask``), written and stripped as the proxy
    strips it for the client's options, is what the client's own request gets. The
    server wrote ``"usage":null`` before the choices of each chunk of a stream that
    asked for usage, its usage before the choices in the last, and no continuous usage
    at all: a client through the meter got every chunk's usage nulled out in another
    place, or lost the ``"usage":null`` it had without the meter."""
    own = {**body, "stream_options": options}
    if options is None:
        del own["stream_options"]
    wanted = asked(own)
    assert wanted is not None and wanted is not Asked.CONTINUOUS
    direct = written(backend, own, script)
    upstream = written(backend, ask(own), script)
    strip = UsageStrip(wanted, null_usage="prompt" in body)
    # In pieces that end nowhere in particular, as the upstream's reads come.
    through = b"".join(strip.feed(upstream[i:i + 61]) for i in range(0, len(upstream), 61))
    through += strip.flush()
    assert _same_request(through) == _same_request(direct)


@pytest.mark.parametrize("body", [{**COMPLETION, "n": 2}, {**CHAT, "n": 2}],
                         ids=["completions", "chat"])
def test_a_merged_chunks_tokens_are_counted_by_its_usage(backend: Backend,
                                                         body: dict[str, Any]) -> None:
    """Behind the built-in server the meter got no continuous usage and counted one
    token a chunk: choice 0's four tokens in three chunks were three, choice 1's four in
    two were two. Its gaps are one a chunk after the first, as its client times them,
    whatever the chunks bring: 2 and 1."""
    upstream = written(backend, ask(body), MERGED)
    judge = StreamJudge(ClassSLO(ttft_p99_ms=60_000, tbt_p99_ms=60_000), 0.0, choices=2,
                        max_tokens=4)
    for i, event in enumerate(upstream.split(b"\n\n")):
        judge.written(event + b"\n\n", 0.01 * (i + 1))
    assert judge.verdicts(1.0) == [Verdict(True, 4), Verdict(True, 4)]
    assert [c.gap_count for c in judge._choices.values()] == [2, 1]
