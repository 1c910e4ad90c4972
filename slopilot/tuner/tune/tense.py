"""In which tense a tune verdict's sentences say what the study found, told to the
sentence builders (``run.py``'s own, ``capacity.CapacityOutcome.sentence``,
``study/verdict.infeasible_sentence``) before they build: they used to be built in the
present and rewritten afterwards by text substitution, which silently did nothing where a
builder's wording was not the one looked for ("3 replicas hold the SLO in every window"
stayed bare where a third of the trace was rejected unjudged)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class When(Enum):
    JUDGED = "judged"
    """The windows' finding is the answer: "holds"."""
    WINDOWS = "windows"
    """The whole-trace replay missed where the windows held: "holds" is the whole trace's
    to say, so the windows' "in every window" is said in the past ("held")."""
    REFUSED = "refused"
    """Too many requests too long (``--max-too-long``): nothing is recommended, and what
    the study found is said of the rest in the past, with no advice a reader could take
    for the answer."""


@dataclass(frozen=True)
class Tense:
    when: When = When.JUDGED
    served: int | None = None
    """Where some requests are rejected unjudged (and accepted): how many fit, of which
    "holds" is said, never bare."""
    keep: bool = True
    """Whether the start config may be advised kept: not where nothing is recommended."""

    @property
    def past(self) -> bool:
        """Everything the study found in the past: refused."""
        return self.when is When.REFUSED

    def hold(self, singular: bool) -> str:
        """The verb of "... the SLO in every window": ``holds``, ``hold`` or ``held``."""
        if self.when is not When.JUDGED:
            return "held"
        return "holds" if singular else "hold"

    def verb(self, present: str, past: str) -> str:
        """``present`` or, refused, ``past``: the study's other findings."""
        return past if self.past else present

    def every_window(self) -> str:
        """``in every window``, of the requests that fit where some do not."""
        if self.served is None:
            return "in every window"
        return f"on the {self.served:,} requests that fit, in every window"

    def kept(self) -> str:
        """The end of the kept start config's sentence."""
        return ": keep the start config, no knob changes." if self.keep else "."


JUDGED = Tense()
"""The verdict's own tense: the builders' default."""
