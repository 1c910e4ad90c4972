"""Where more replicas stop helping: read from a capacity search's own per-count results.

When no count in [lo, hi] holds the SLO, the search may show that replicas are not the
cure: the worst term stays where it is as the count grows (``Flat``), bound by what each
request costs alone (a long prompt's prefill on an idle replica, one decode step), which
more replicas do not shorten. ``slopilot tune`` says so in its capacity answer
(``tune/capacity.py``); the live loop sizes its fleet by it (``scaling.py``,
``steady.py``): buying ``max_replicas`` for an SLO no count holds kept 8 replicas for 30
breached minutes that one or two served as badly (the review's impossible-SLO case).

``plateau`` is the smallest count tried from which no larger count tried lowers the
worst term materially: by ``FLAT_SHARE`` of its limit and by ``GAP_CLOSED`` of its
distance to the limit per doubling. When that is the largest count tried
(each doubling still helps), the overload is capacity-bound and the loop still buys the
cap; below it, the counts above the plateau are spend without effect. A plateau whose
count holds the SLO itself (only not with the caller's margin) is none: that is no SLO
below one request.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from slopilot.tuner.study.objective import TrialResult
from slopilot.tuner.study.verdict import term_label, worst_share

FLAT_SHARE = 0.05
"""How little a doubling of replicas may move the worst term (in shares of its limit) for
the search to call it flat: well under what a doubling does to a load-bound term."""
GAP_CLOSED = 0.25
"""For the loop, a doubling must also close this much of the worst term's distance to its
limit: its searches judge short runs whose P99 is a few long prompts' largest, and far
over the limit those move by more than ``FLAT_SHARE`` from one count to another without
coming nearer (the review's rerun: 499 % on 4 replicas, 437 % on 8). A load-bound term
closes far more: the queue it waits in is what a doubling halves."""


def _share(r: TrialResult) -> float:
    return max(r.constraints, default=-1.0) + 1.0


@dataclass(frozen=True)
class Flat:
    """The worst term barely moved from ``below`` to ``top`` replicas, both missing."""

    term: str
    below: int
    top: int
    share_below: float
    share_top: float

    def text(self) -> str:
        label = term_label(self.term)[0]
        shares = (f"{self.share_top:.0%}" if f"{self.share_below:.0%}" == f"{self.share_top:.0%}"
                  else f"{self.share_below:.0%}-{self.share_top:.0%}")
        return (f"More replicas do not move it: {label} stays at {shares} of its limit "
                f"from {self.below} to {self.top} replicas, the time each request takes "
                "alone (such as the prefill of the longest prompts), which replicas do not "
                "shorten; a faster GPU, tensor parallelism, shorter prompts in that class or "
                "a looser limit can.")


def flat(tried: Mapping[int, TrialResult]) -> Flat | None:
    """The worst term of the two largest counts tried, when it is the same term and moved
    less than ``FLAT_SHARE`` of its limit; None otherwise (or with fewer than two)."""
    counts = sorted(tried)
    if len(counts) < 2:
        return None
    below, top = (tried[n] for n in counts[-2:])
    if not below.constraint_names or worst_share(below)[1] != worst_share(top)[1]:
        return None
    term = worst_share(top)[1]
    share_below, share_top = _share(below), _share(top)
    if term is None or share_below - share_top >= FLAT_SHARE:
        return None
    return Flat(term, counts[-2], counts[-1], share_below, share_top)


@dataclass(frozen=True)
class Plateau:
    """A search in which no count held, and the smallest count past which more do not
    move its worst term (``FLAT_SHARE``)."""

    replicas: int
    """The smallest count tried no worse (within ``FLAT_SHARE``) than any larger one."""
    flat: Flat
    """The worst term from ``replicas`` to the largest count tried."""
    shares: tuple[tuple[int, float, str | None], ...]
    """(count, worst share, worst term) for every count tried, in order."""

    def table(self) -> str:
        """Each count's worst share of its limit, ``1: 279%, 2: 212%``; a count whose worst
        term is another than the plateau's names it."""
        return ", ".join(f"{n}: {share:.0%}" + ("" if term in (None, self.flat.term)
                                                 else f" ({term_label(term)[0]})")
                         for n, share, term in self.shares)

    def text(self) -> str:
        label = term_label(self.flat.term)[0]
        return (f"no replica count holds the SLO: {label} per replica count tried, as a "
                f"share of its limit: {self.table()}; more replicas do not move it past "
                f"{self.replicas}: the SLO is below what one request can take (such as "
                "the prefill of the longest prompts alone); loosen the SLO or change the "
                "model or GPU (a faster GPU, tensor parallelism)")


def _material(share_n: float, share_m: float, doublings: float) -> bool:
    """Whether going from a count to one ``doublings`` doublings larger moves the worst
    term enough to count: by ``FLAT_SHARE`` of its limit (tune's test) and by
    ``GAP_CLOSED`` of its distance to the limit per doubling."""
    drop, gap = share_n - share_m, share_n - 1.0
    if drop < FLAT_SHARE:
        return False
    return gap <= 0 or drop / gap >= 1.0 - (1.0 - GAP_CLOSED) ** doublings


def plateau(tried: Mapping[int, TrialResult]) -> Plateau | None:
    """Where more replicas stop helping, for a search in which no count held (the
    caller's to know: it holds with its own margin): the smallest count from which no
    larger count tried moves the worst term materially (``_material``). None when that is
    the largest count tried (every step up still helped: capacity-bound), or with fewer
    than two counts. Being no worse than every larger count tried, it is no worse than the
    current one either, when that is larger (shares are taken as monotone in the count,
    as the search takes feasibility)."""
    counts = sorted(tried)
    if len(counts) < 2:
        return None
    shares = {n: _share(tried[n]) for n in counts}
    top_term = worst_share(tried[counts[-1]])[1]
    if top_term is None:
        return None
    for i, n in enumerate(counts[:-1]):
        if any(_material(shares[n], shares[m], math.log2(m / n)) for m in counts[i + 1:]):
            continue
        if shares[n] <= 1.0:
            # It holds the SLO, only not with the caller's headroom (a scale-down's 20 %):
            # no sign of an SLO below one request, and a fleet moved to it on that reading
            # went from 2 replicas to 1 where one truly misses by 8 %.
            return None
        found = Flat(top_term, n, counts[-1], shares[n], shares[counts[-1]])
        return Plateau(n, found, tuple((m, shares[m], worst_share(tried[m])[1])
                                       for m in counts))
    return None
