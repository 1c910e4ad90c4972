"""A stream's token gaps as its client counts them, from when each chunk was written.

A client reading a stream sees chunks, not tokens: the time since the last chunk that
brought tokens is shared by the ``n`` tokens a chunk brings, and those of the first chunk
came with no gap (its wait is the TTFT). The server's delivery (``server/responses.py``)
and the meter beside vLLM (``meter/``) both count a stream's gaps this way, the way
``benchmarks/loop_truth.py``'s client does, so the TBT and the verdicts the loop reads are
the ones a client measures on its own side.
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
        return [(at - previous) / tokens] * tokens
