"""What a trace asks of the KV cache over time, estimated without simulating it.

A request holds its context in the KV cache from its arrival for as long as it lives
served without queueing (its residency: ``lifetimes.residency_s``, its prefill plus its
output tokens at the decode step of a full cache). Its context grows from its prompt to
its prompt plus output at an even pace over that time, so the cache's demand is a sum of
straight lines: piecewise linear in time, jumping up by a prompt at an arrival and down
by a whole context at a departure. Everything here is exact for that model and
vectorised: one sort of the arrivals and departures, cumulative sums over them, and a
binary search per query (a trace of 10^6 requests in well under a second).

It is a bound of a kind, not a replay: prefixes shared between requests alive together
are counted once per request (each sequence's own blocks, as vLLM allocates them without
a shared prefix), blocks are not rounded up, and nothing waits, so where the demand
passes what the cache admits, the replay queues (or preempts) instead, and its requests
live longer than this says. It is meant to find *where* a trace fills the cache, which
is where those queues form.
"""

from __future__ import annotations

import numpy as np


class KVDemand:
    """The KV tokens a trace's requests hold at each moment (see the module docstring).

    ``times`` are arrivals (sorted or not), ``prompt`` and ``output`` each request's
    tokens, ``residency_s`` how long each stays; a request with a residency of 0 holds
    nothing (one refused on arrival)."""

    def __init__(self, times: np.ndarray, prompt: np.ndarray, output: np.ndarray,
                 residency_s: np.ndarray) -> None:
        arrays = [np.asarray(a, dtype=np.float64) for a in (times, prompt, output,
                                                             residency_s)]
        if len({len(a) for a in arrays}) != 1:
            raise ValueError("times, prompt, output and residency_s: expected one value "
                             "per request in each")
        t, p, o, r = arrays
        if not (np.isfinite(r).all() and (r >= 0).all()):
            raise ValueError("residency_s: expected finite seconds >= 0 for every request")
        live = r > 0
        t, p, o, r = t[live], p[live], o[live], r[live]
        grow = o / np.where(r > 0, r, 1.0)  # tokens a second each context grows by
        # Each request's term is p + g (x - t) while alive: the sums over the alive ones of
        # p, g and g t give the demand at any x as P + G x - H, linear between events.
        when = np.concatenate((t, t + r))
        order = np.argsort(when, kind="stable")
        self._at = when[order]
        sign = np.concatenate((np.ones(len(t)), -np.ones(len(t))))[order]
        self._p = np.cumsum(sign * np.concatenate((p, p))[order])
        self._g = np.cumsum(sign * np.concatenate((grow, grow))[order])
        self._h = np.cumsum(sign * np.concatenate((grow * t, grow * t))[order])
        # The demand at each event (after it) and at the next one (before it): the ends of
        # each straight piece.
        self._after = self._line(np.arange(len(self._at)), self._at)
        self._before = self._line(np.arange(len(self._at) - 1), self._at[1:])
        self._done: dict[float, np.ndarray] = {}
        """Per ``room``: token-seconds above it from the first event to each event."""

    def _line(self, k: np.ndarray, x: np.ndarray) -> np.ndarray:
        """The demand at ``x`` on the piece that starts at event ``k`` (none: 0)."""
        if not len(self._at):
            return np.zeros(np.shape(x))
        kk = np.maximum(k, 0)
        value = self._p[kk] + self._g[kk] * x - self._h[kk]
        # Rounding leaves a few tokens' dust where nothing is alive.
        return np.where(k >= 0, np.maximum(value, 0.0), 0.0)

    def at(self, x: np.ndarray) -> np.ndarray:
        """The tokens held at each time in ``x`` (arrivals at ``x`` in, departures out)."""
        x = np.asarray(x, dtype=np.float64)
        return self._line(np.searchsorted(self._at, x, side="right") - 1, x)

    def excess(self, starts: np.ndarray, ends: np.ndarray, room: float) -> np.ndarray:
        """Token-seconds held above ``room`` tokens in each ``[start, end)``: the integral
        of the demand's excess over it."""
        if room < 0:
            raise ValueError(f"room={room!r}: expected tokens >= 0")
        return self._upto(np.asarray(ends, np.float64), room) \
            - self._upto(np.asarray(starts, np.float64), room)

    def peak(self, start: float, end: float) -> float:
        """The most tokens held at once in ``[start, end]``."""
        inside = np.flatnonzero((self._at >= start) & (self._at <= end))
        # Straight between events: the most is at an end or at an event (just after it,
        # or just before it where a departure drops it).
        values = [self.at(np.array([start, end])), self._after[inside],
                  self._before[inside[inside > 0] - 1]]
        return float(np.concatenate(values).max())

    def _upto(self, x: np.ndarray, room: float) -> np.ndarray:
        """Token-seconds above ``room`` from the first event up to each ``x``."""
        if not len(self._at):
            return np.zeros(len(x))
        done = self._done.get(room)
        if done is None:
            pieces = _above(self._after[:-1], self._before, np.diff(self._at), room)
            done = self._done[room] = np.concatenate(([0.0], np.cumsum(pieces)))
        k = np.searchsorted(self._at, x, side="right") - 1
        kk = np.maximum(k, 0)
        partial = _above(self._after[kk], self._line(k, x), x - self._at[kk], room)
        return np.where(k >= 0, done[kk] + partial, 0.0)


def _above(a: np.ndarray, b: np.ndarray, dx: np.ndarray, room: float) -> np.ndarray:
    """The integral of ``max(0, y - room)`` over a straight piece of length ``dx`` from
    ``y = a`` to ``y = b``."""
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    whole = ((a + b) / 2 - room) * dx
    # Crossing ``room``: a triangle over the part above it.
    span = np.where(hi > lo, hi - lo, 1.0)
    part = (hi - room) ** 2 / (2 * span) * dx
    return np.where(lo >= room, whole, np.where(hi > room, part, 0.0))
