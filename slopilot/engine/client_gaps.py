"""A stream's gaps as its client counts them: one a chunk that brings tokens.

A client reading a stream sees chunks, not tokens. Each chunk that brings tokens after
the first is one gap: the wait since the last chunk that brought any, however many it
brings; the first chunk's wait is the TTFT, no gap. So ``vllm bench serve`` times them
(one ITL a streamed chunk after the first: ``endpoint_request_func``), so does an
``openai`` SDK user (the time between content deltas), and vLLM's own
``vllm:inter_token_latency_seconds`` is observed once per engine output of a request
(one an iteration, however many tokens it brings). A 3 s event-loop stall whose 150
backed-up tokens go out in one chunk is one 3 s gap: counted one a token, the stall and
149 gaps of 0, it hid in proportion to the tokens it held back (a client's gap P99 of
122 ms read 15 ms on the server, under a 20 ms target). The gaps are therefore no count
of tokens: their number is the chunks' less one, and tokens are counted apart
(``vllm:generation_tokens_total``, the usage).

The server's delivery (``server/responses.py``) and the meter beside vLLM (``meter/``)
both count a stream's gaps this way, so the TBT and the verdicts the loop reads are the
ones a client measures on its own side.
"""

from __future__ import annotations


class ClientGaps:
    """The gaps of one stream's chunks, as they are written."""

    def __init__(self) -> None:
        self.last_written_at: float | None = None
        """When the last chunk that brought tokens was written; None before the first."""

    def written(self, tokens: int, at: float) -> float | None:
        """The gap of a chunk of ``tokens`` written at ``at``: the wait since the last
        chunk that brought tokens; None for the first such chunk (its wait is the TTFT)
        and for one that brings none (the clock goes on from the last that did)."""
        if tokens <= 0:
            return None
        previous, self.last_written_at = self.last_written_at, at
        return None if previous is None else at - previous
