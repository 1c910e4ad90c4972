"""A stream's token gaps as its client counts them, from when each chunk was written.

A client reading a stream sees chunks, not tokens: each token reaches it with its chunk.
The first of the ``n`` tokens a chunk brings waited the whole time since the last chunk
that brought tokens; the others came with it, no gap; those of the first chunk came with
no gap either (its wait is the TTFT). So a chunk's wait is one gap, as ``vllm bench serve``
(one ITL a chunk) and an ``openai`` SDK user (the time between content deltas) time it:
a 60 ms stall that brings two tokens is a 60 ms gap and a 0, not two of 30 ms, which
would hide it under a 40 ms target (``benchmarks/client_truth.py``). The gaps are still
one a token, so their number and their mean are the tokens'.

The server's delivery (``server/responses.py``) and the meter beside vLLM (``meter/``)
both count a stream's gaps this way, so the TBT and the verdicts the loop reads are the
ones a client measures on its own side.
"""

from __future__ import annotations


class ClientGaps:
    """The gaps of one stream's tokens, chunk by chunk."""

    def __init__(self) -> None:
        self.last_written_at: float | None = None
        """When the last chunk that brought tokens was written; None before the first."""

    def written(self, tokens: int, at: float) -> list[float]:
        """The gaps of the ``tokens`` a chunk written at ``at`` brings (none for none)."""
        if tokens <= 0:
            return []
        previous, self.last_written_at = self.last_written_at, at
        if previous is None:
            return [0.0] * (tokens - 1)
        return [at - previous] + [0.0] * (tokens - 1)
