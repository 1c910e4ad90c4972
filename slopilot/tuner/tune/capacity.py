"""The capacity answer: when no config holds the SLO on the replicas tuned at, the
smallest replica count that holds it, by the loop's own capacity search
(``loop/capacity.CapacityPlanner``) over the same windows and verdict.

The config that came closest on too few replicas is not always the best on more: under
overload a small ``max_num_seqs`` can buy TTFT that costs throughput once there is room.
So a few candidates are searched (the closest trials and the start config), each only
below the best count found so far, and the smallest count wins (ties: the earlier
candidate).

When none holds, the search may show that replicas are not the cure: a term that stays
where it is as the count doubles (``Flat``, in ``loop/replica_plateau.py``: one test for
this and the live loop) is bound by what each request costs alone (a long prompt's
prefill on an idle replica, one decode step), which more replicas do not shorten.
``tiny-cpu`` is the case: its P0 prompts reach 7,000 tokens after the shift, and their
prefill alone takes longer than P0's 300 ms TTFT limit on one A100, so its P0 TTFT p99
reads the same share of its limit on 2 replicas as on 16. The test reads one
candidate's two largest counts, and the closest candidate's term may still fall over its
last doubling where another's has stopped (tiny-cpu: the start config's P0 TTFT p99 144 %
on 8 replicas, 126 % on 16, 32 and 64; trial 24's 132 % and 131 %): then both are said
(``flat_elsewhere``), not "raise --max-replicas". (tiny-cpu's figures are from before
its seeds' idle floor was priced: P0's, 376 ms, now rules every count out unreplayed.)

The flatness test reads two counts' P99s, and dispatch noise moves those: a reviewer's P0
TTFT p99 read 200 % of its limit on 2 replicas, 175 % on 4, 171 % on 8 and 151 % on 16,
not flat by that test, and the answer said "raise --max-replicas" for a term whose
prompts each alone on an idle replica read 133 ms against its 100 ms limit. So where no
count holds, each TTFT term is also held against its class's idle floor
(``idle_floor.py``: over a trace, or an open-loop workload's seeds): at ``FLOOR_SHARE``
of its limit or more, on every candidate's knobs, no replica count holds, and the answer
says so with the floor's figures.

The floor is priced before any count is replayed (two one-request runs per class and
candidate, well under a second): where it is past a class's limit itself on every
candidate's knobs, no count can hold the SLO, nor be within it short of the headroom, so
the search is skipped (a reviewer's tune of a bursty trace spent 207 s of 304 s replaying
9 counts, 3 candidates on 2, 4 and 8 replicas, that the floor ruled out). A floor
between ``FLOOR_SHARE`` and the limit leaves no count the headroom but may leave one
within the SLO, which the answer names: those counts are still replayed.

"Holds" is the headroom's (every term at most 90 % of its limit), and a count short of
it may be well within the SLO: a reviewer read "12 replicas hold (11: misses)" and
``simulate --replicas 11`` held at 80 %, where tune's windows read 91 %. So each count
says which it missed, the SLO or only the headroom, the count below the answer what it
missed by and in which window (``simulate`` replays the trace whole, not tune's windows),
and a larger count reading worse than the answer is named as what it is: the windows'
P99 noise, since more replicas never serve the same traffic worse. Where none has the
headroom, the answer is the closest candidate's (``_closeness``), and a count within the
SLO is said to be (a reviewer's read "Not even 16 replicas hold the SLO" beside a 16
within it at 91 %, and a table of the first candidate's figures beside another's).

That noise can also flip a verdict, N holding while N + 1 misses, and the bisection
takes holding as monotone: so the search checks its count (``loop/steady_count.py``, as
it does for the live loop), the answer is the smallest count that holds with its next
count holding too, up to ``hi`` even where a later candidate searches below the best
count so far, and a count that held while the next missed is named (``flips``) rather
than answered with."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from slopilot.engine.sim.scenario import Scenario
from slopilot.engine.sim.workload_spec import TraceSpec
from slopilot.tuner.loop.capacity import CapacityPlanner
from slopilot.tuner.loop.replica_plateau import Flat, flat
from slopilot.tuner.loop.steady_count import given_up
from slopilot.tuner.sim.robust import RobustEvaluator
from slopilot.tuner.study.objective import TrialResult, WindowResult
from slopilot.tuner.study.verdict import (
    replicas_text,
    term_label,
    term_requests,
    worst_share,
)
from slopilot.tuner.tune.idle_floor import FloorBook, IdleFloor
from slopilot.tuner.tune.tense import JUDGED, Tense
from slopilot.tuner.tune.whole_check import ReplayProgress


@dataclass(frozen=True)
class CapacityOutcome:
    replicas: int | None
    """The smallest count in [lo, hi] that holds; None when even ``hi`` does not."""
    config: Mapping[str, Any]
    """The knobs it holds with (the closest candidate's when none holds: ``_closeness``)."""
    label: str
    """Which candidate that is: ``trial 27``, ``the start config``."""
    lo: int
    hi: int
    tried: Mapping[int, TrialResult] = field(default_factory=dict)
    """The winning candidate's results per count."""
    searched: tuple[tuple[str, int, bool, bool], ...] = ()
    """(candidate, replicas, holds with the headroom, within the SLO) for every
    simulation, in order."""
    lucky: tuple[int, ...] = ()
    """Counts of this candidate that held while the count above them missed
    (``steady_count``): holding is not monotonic over the counts tried."""
    gave_up: bool = False
    """After ``steady_count.RECHECKS`` + 1 lucky counts the climb stopped: ``replicas``
    is the smallest count that holds above the largest count tried that missed, its next
    count not checked."""
    checked: bool = False
    """The answer's next count was run by ``steady_count`` alone, not the search: to
    check that the answer did not hold by luck."""
    floors: tuple[IdleFloor, ...] = ()
    """When none holds: each TTFT-limited class's idle floor, the lowest over the
    candidates' knobs (``idle_floor.py``; none for a session workload)."""
    others: tuple[tuple[str, Mapping[int, TrialResult]], ...] = ()
    """The other candidates searched and their results per count, in search order: where
    none holds, one of them may show the closest's worst term flat (``flat_elsewhere``)."""
    skipped: bool = False
    """No count was replayed: a floor past its limit rules every count out."""
    judged_margin: float = 0.0
    """The headroom asked for, where no count was replayed to carry it."""

    @property
    def margin(self) -> float:
        """The headroom the counts were judged with."""
        return next((r.margin for r in self.tried.values()), self.judged_margin)

    def binding(self) -> tuple[IdleFloor, ...]:
        """The floors that leave no replica count to hold their term."""
        return tuple(f for f in self.floors if f.binds)

    def flat(self) -> Flat | None:
        """The worst term of the two largest counts tried, when it is the same term and
        moved less than ``FLAT_SHARE`` of its limit (``loop/replica_plateau.flat``, the
        live loop's test too); None when some count holds."""
        return None if self.replicas is not None else flat(self.tried)

    def flat_elsewhere(self) -> tuple[str, Flat] | None:
        """Where none holds and the closest candidate's worst term still moved over its
        last doubling: the first other candidate searched whose same term is flat (its
        label and ``Flat``); None otherwise. tiny-cpu: trial 24's P0 TTFT p99 read 132 %
        on 8 replicas and 131 % on 16, the start config's 144 % and 126 %, the lowest on
        16 and so the closest, and the answer said "raise --max-replicas" where the start
        config reads 126 % on 32 and 64 too."""
        if self.replicas is not None or not self.tried or self.flat() is not None:
            return None
        term = worst_share(self.tried[max(self.tried)])[1]
        for label, tried in self.others:
            f = flat(tried)
            if f is not None and f.term == term:
                return label, f
        return None

    def _flat_elsewhere_text(self, label: str, f: Flat) -> str:
        """Both candidates' figures, said as they are: the other's term is flat, the
        closest's still fell over its last doubling, so whether more replicas lower it
        further the search cannot tell, only that it is the same term."""
        counts = sorted(self.tried)
        top, below = counts[-1], (counts[-2] if len(counts) > 1 else None)
        share_top = worst_share(self.tried[top])[0]
        fell = ("" if below is None else
                f", still fell from {worst_share(self.tried[below])[0]} on {below}")
        shares = (f"{f.share_top:.0%}" if f"{f.share_below:.0%}" == f"{f.share_top:.0%}"
                  else f"{f.share_below:.0%}-{f.share_top:.0%}")
        return (f"With {label}'s knobs more replicas do not move it: "
                f"{term_label(f.term)[0]} stays at {shares} of its limit from {f.below} to "
                f"{f.top} replicas, the time each request takes alone (such as the prefill "
                f"of the longest prompts), which replicas do not shorten. "
                f"{self.label[:1].upper()}{self.label[1:]}'s {term_label(f.term)[0]}, the "
                f"lowest on {top} replicas "
                f"({share_top}){fell}: more replicas may lower it a little further, but "
                "not below what its requests take alone: a faster GPU, tensor parallelism, "
                "shorter prompts in that class or a looser limit are the cure.")

    def table_lines(self) -> list[str]:
        """The report's table: per count the winning candidate tried, whether it holds and
        its worst term, named, as a share of its limit."""
        lines = [self.sentence(), "", self.whose(), "",
                 f"| replicas | within SLO | with {self.margin:.0%} headroom | worst term | "
                 "share of limit | in window |", "|---|---|---|---|---|---|"]
        for n, r in sorted(self.tried.items()):
            share, name = worst_share(r)
            label = "-" if name is None else term_label(name)[0]
            # Its name only: the windows' table above gives each one's span and rates.
            deciding = _deciding(r)
            window = None if deciding is None else deciding.name
            lines.append(f"| {n} | {'yes' if within_slo(r) else 'no'} | "
                         f"{'yes' if r.feasible else 'no'} | {label} | {share} | "
                         f"{'-' if window is None else window} |")
        if self.skipped:
            # An empty table (or the tuned count's row alone) would read as a search lost.
            lines += ["", f"No count from {self.lo} to {self.hi} was replayed: the idle "
                      "floor above rules every count out."]
        noise = self.noise()
        return lines + ([] if noise is None else ["", noise])

    def whose(self) -> str:
        """Whose figures the table shows and, where none holds, in what sense it came
        closest (``_closeness``): the verdict's "closest" is the study's, on the count tuned
        at, and may be another config (tiny-cpu: trial 24 there, the start config on 16)."""
        if self.replicas is not None:
            return f"Each count's figures are {self.label}'s."
        within = [n for n, r in self.tried.items() if within_slo(r)]
        if within:
            why = f": within the SLO on the fewest replicas ({min(within)})"
        elif self.tried:
            why = (f" on {max(self.tried)} replicas, the most searched (its worst term the "
                   "lowest there)")
        else:
            why = ""
        return f"Each count's figures are {self.label}'s, the candidate closest to holding{why}."

    def below(self) -> str | None:
        """What the count one below the answer missed, and by how much; None where the
        search did not simulate it."""
        if self.replicas is None or self.replicas - 1 not in self.tried:
            return None
        n, r = self.replicas - 1, self.tried[self.replicas - 1]
        share, name = worst_share(r)
        term = "its worst term" if name is None else term_label(name)[0]
        window = _worst_window(r)
        where = "" if window is None else f", in {window}"
        asked = None if name is None else term_requests(r, name)
        if asked is not None:
            where += f" (a P99 over {asked[0]}'s {asked[1]:,.0f} requests)"
        if within_slo(r):
            return (f"{n} replica{'s are' if n != 1 else ' is'} within the SLO but not the "
                    f"{self.margin:.0%} headroom: {term} at {share} of its limit (needs at "
                    f"most {1 - self.margin:.0%}){where}.")
        return f"{n} replica{'s miss' if n != 1 else ' misses'} the SLO itself: {term} at " \
            f"{share} of its limit{where}."

    def noise(self) -> str | None:
        """Where a count above the answer reads worse than it: more replicas never serve
        the same traffic worse, so that is the windows' P99 noise (a window's P99 is its
        few largest requests'), said rather than hidden; None where none does."""
        if self.replicas is None:
            return None
        at = max(self.tried[self.replicas].constraints, default=-1.0)
        worse = [(n, r) for n, r in sorted(self.tried.items())
                 if n > self.replicas and max(r.constraints, default=-1.0) > at]
        if not worse:
            return None
        answer = worst_share(self.tried[self.replicas])[0]
        parts = []
        for n, r in worse:
            share, name = worst_share(r)
            term = "its worst term" if name is None else term_label(name)[0]
            parts.append(f"{n} replicas read {term} at {share} of its limit, above "
                         f"{self.replicas}'s {answer}"
                         + ("" if r.feasible else f" (short of the {self.margin:.0%} headroom)"))
        return ("; ".join(parts) + ". More replicas never serve the same traffic worse: "
                "the difference is the windows' P99 noise (each window's P99 is its few "
                "largest requests'), so take counts this close as equal; a longer "
                "--duration judges each on more requests.")

    def flips(self, tense: Tense = JUDGED) -> str | None:
        """Where a count held and the count above it missed, said plainly: the answer is
        then the smallest count whose next count holds too, not the first that held;
        None where holding was monotone over the counts tried."""
        holds = tense.verb("holds", "held")
        if not self.lucky:
            return None
        pairs = "; ".join(f"{replicas_text(n)} held but {n + 1} missed"
                          for n in self.lucky)
        if self.replicas is not None and self.gave_up:
            end = given_up(self.replicas, {n: r.feasible for n, r in self.tried.items()},
                            "tried")
        elif self.replicas is not None:
            end = (f"so the answer is {self.replicas}, the smallest count tried that "
                   f"{holds} with every count tried above it holding too")
        else:
            end = f"and no count up to {self.hi} {holds} with the count above it holding too"
        stopped = (f"; after {len(self.lucky)} such counts the climb stopped"
                   if self.gave_up else "")
        return (f"Holding is not monotonic over the counts tried: {pairs} (a window's P99 "
                f"rests on where its few largest requests land){stopped}, {end}.")

    def sentence(self, tense: Tense = JUDGED) -> str:
        """The answer in ``tense``: the verdict's, the windows' where the whole trace
        missed, or the past where too many requests too long refuse it."""
        flips = self.flips(tense)
        text = self._sentence(tense)
        return text if flips is None else f"{text} {flips}"

    def _sentence(self, tense: Tense) -> str:
        holds, hold = tense.verb("holds", "held"), tense.verb("hold", "held")
        tried = ", ".join(f"{label} on {n}: " + (f"{holds} with headroom" if ok else
                                                    "within the SLO, not the headroom"
                                                    if within else "misses the SLO")
                          for label, n, ok, within in self.searched)
        if self.replicas is None:
            within = self.within()
            bound = self.binding()
            if within is not None:
                # Short of the headroom only: "no count holds the SLO" would be false, and
                # "relax the SLO" advice for a count already within it.
                head = (f"{'No replica count' if bound else f'Not even {self.hi} replicas'} "
                        f"{holds if bound else hold} the SLO with {self.margin:.0%} headroom; "
                        f"{within} (tried: {tried})")
                if bound:
                    return head + ": " + "; ".join(f.text() for f in bound) + "."
                flat = self.flat()
                if flat is not None:
                    return f"{head}. {flat.text()}"
                if (elsewhere := self.flat_elsewhere()) is not None:
                    return f"{head}. {self._flat_elsewhere_text(*elsewhere)}"
                return (f"{head}; raise --max-replicas for a count with the headroom (tune "
                        f"judges with the live loop's {self.margin:.0%} headroom and has no "
                        "flag to lower it).")
            if bound and self.skipped:
                return (f"No replica count {holds} the SLO, so none was replayed: "
                        + "; ".join(f.text() for f in bound)
                        + ". More replicas only take the queue away, not a prompt's own "
                          "prefill: a faster GPU, tensor parallelism, shorter prompts in "
                          "that class or a looser limit can.")
            if bound:
                return (f"No replica count {holds} the SLO (tried: {tried}): "
                        + "; ".join(f.text() for f in bound)
                        + ". More replicas only take the queue away, not a prompt's own "
                          "prefill: a faster GPU, tensor parallelism, shorter prompts in "
                          "that class or a looser limit can.")
            flat = self.flat()
            if flat is not None:
                return (f"Not even {self.hi} replicas {hold} the SLO (tried: {tried}). "
                        + flat.text())
            if (elsewhere := self.flat_elsewhere()) is not None:
                return (f"Not even {self.hi} replicas {hold} the SLO (tried: {tried}). "
                        + self._flat_elsewhere_text(*elsewhere))
            return (f"Not even {self.hi} replicas {hold} the SLO (tried: {tried}); raise "
                    "--max-replicas, relax the SLO, or use a larger GPU or model "
                    "parallelism.")
        below = self.below()
        # A count above the answer in the list, run after the search found the answer,
        # reads as a search that went on for nothing: why it ran, said (flips() says it
        # where a count did hold by luck).
        check = (f" {self.replicas + 1} was run only to check that {self.replicas} did not "
                 "hold by luck (a window's P99 rests on where its few largest requests "
                 f"land): it {holds} too." if self.checked and not self.lucky else "")
        verb = tense.hold(singular=self.replicas == 1)
        return (f"{replicas_text(self.replicas)} {verb} the SLO "
                f"{tense.every_window()} with {self.margin:.0%} headroom, with "
                f"{self.label}'s knobs "
                f"(tried: {tried}).{check}" + ("" if below is None else f" {below}"))

    def within(self) -> str | None:
        """When none holds with the headroom: the smallest count within the SLO itself,
        its worst term and share, as a clause; None where none is."""
        # A count that held with the headroom by luck (``lucky``) is not "short of it".
        n = min((n for n, r in self.tried.items() if within_slo(r) and not r.feasible),
                default=None)
        if self.replicas is not None or n is None:
            return None
        share, name = worst_share(self.tried[n])
        term = "its worst term" if name is None else term_label(name)[0]
        return (f"{n} replica{'s are' if n != 1 else ' is'} within the SLO ({term} at "
                f"{share} of its limit) with {self.label}'s knobs, short of the headroom only")

    def to_dict(self) -> dict[str, Any]:
        flat: dict[str, Any] | None = None
        if (own := self.flat()) is not None:
            flat = {**dataclasses.asdict(own), "candidate": self.label}
        elif (elsewhere := self.flat_elsewhere()) is not None:
            flat = {**dataclasses.asdict(elsewhere[1]), "candidate": elsewhere[0]}
        return {"replicas": self.replicas, "lo": self.lo, "hi": self.hi,
                "config": dict(self.config), "candidate": self.label,
                "tried": {str(n): {"feasible": r.feasible, "within_slo": within_slo(r),
                                   "worst_term": max(r.constraints, default=0.0),
                                   "worst_term_name": worst_share(r)[1]}
                          for n, r in sorted(self.tried.items())},
                "flat": flat,
                "idle_floor": [f.to_dict() for f in self.floors],
                "monotonic": not self.lucky, "lucky": list(self.lucky),
                "gave_up": self.gave_up,
                "searched": [{"candidate": label, "replicas": n, "feasible": ok,
                              "within_slo": within}
                             for label, n, ok, within in self.searched]}


def within_slo(r: TrialResult) -> bool:
    """Every term within its limit: the SLO itself, without the headroom."""
    return all(c <= 0.0 for c in r.constraints)


def _closeness(o: CapacityOutcome) -> tuple[float, float]:
    """Which candidate came closest when none holds: the one within the SLO on the fewest
    replicas, else the lowest worst term on its largest count. The table and the sentence
    then show its figures, not the first candidate's beside another's verdict."""
    within = [n for n, r in o.tried.items() if within_slo(r)]
    top = max(o.tried[max(o.tried)].constraints, default=0.0) if o.tried else float("inf")
    return (float(min(within)) if within else float("inf"), top)


def _deciding(r: TrialResult) -> WindowResult | None:
    """The window where ``r``'s worst term is, None without windows: the figure
    ``simulate`` cannot show, since it replays the trace whole."""
    if not r.windows or not r.constraints:
        return None
    i = max(range(len(r.constraints)), key=lambda k: r.constraints[k])
    return max(r.windows, key=lambda w: w.result.constraints[i])


def _worst_window(r: TrialResult) -> str | None:
    w = _deciding(r)
    return None if w is None else w.span


def capacity_answer(evaluator: RobustEvaluator,
                    candidates: Sequence[tuple[str, Mapping[str, Any]]], lo: int, hi: int,
                    note: Callable[[str], None] = lambda _: None,
                    progress: ReplayProgress | None = None,
                    book: FloorBook | None = None) -> CapacityOutcome:
    """Search ``[lo, hi]`` from below (``CapacityPlanner.search``) for each candidate,
    unless the idle floor rules every count out (``_floors``; ``book``: the floors priced
    already, the start config's before the study). ``progress`` shows each replay."""
    if not candidates:
        raise ValueError("candidates is empty: the capacity search needs a config")
    unique: list[tuple[str, Mapping[str, Any]]] = []
    for label, config in candidates:
        if all(config != seen for _, seen in unique):
            unique.append((label, config))
    floors = _floors(evaluator, [config for _, config in unique], book)
    if any(f.past_limit for f in floors):
        label, config = unique[0]  # the study's closest: no replay ranks them here
        note("capacity: no replica count is replayed: "
             + "; ".join(f.text() for f in floors if f.past_limit))
        return CapacityOutcome(None, dict(config), label, lo, hi, floors=floors,
                               skipped=True, judged_margin=evaluator.margin)
    searched: list[tuple[str, int, bool, bool]] = []
    best: CapacityOutcome | None = None
    outcomes: list[CapacityOutcome] = []
    # Each candidate's climb from lo to hi, what a search in which none holds replays:
    # the count shown (``~``) until a count holds and the bisection takes over.
    climb = _climb(lo, hi) * len(unique)
    for label, config in unique:
        top = hi if best is None or best.replicas is None else best.replicas - 1
        if top < lo:
            break

        runs: dict[int, TrialResult] = {}

        def run(n: int, cfg: Mapping[str, Any] = config, label: str = label,
                runs: dict[int, TrialResult] = runs) -> TrialResult:
            if n not in runs:  # the steadiness check reads the bisection's runs again
                note(f"capacity: {label} on {replicas_text(n)} ...")
                on_n = evaluator.at_replicas(n)
                if progress is not None:
                    k = len(searched) + 1
                    on_n.progress = progress.replay(
                        f"replica search: {label} on {replicas_text(n)}, "
                        f"replay {k} of ~{max(k, climb)}", evaluator.plan.simulated_s)
                result = runs[n] = on_n.evaluate(cfg)
                searched.append((label, n, result.feasible, within_slo(result)))
                # The table's and the verdict's three words, not "does not hold" for a
                # count the verdict then calls within the SLO.
                said = (f"holds the SLO with {result.margin:.0%} headroom" if result.feasible
                        else f"is within the SLO, not the {result.margin:.0%} headroom"
                        if within_slo(result) else "misses the SLO")
                note(f"capacity: {label} on {replicas_text(n)} {said}")
            return runs[n]

        def score(scenario: Scenario, cfg: Mapping[str, Any], n: int,
                  run: Callable[[int], TrialResult] = run) -> TrialResult:
            return run(n)

        # Its count checked against its next one up to ``hi`` (``steady_count``), not
        # only ``top``: a count below the best so far may hold while the next misses.
        answer = CapacityPlanner(score_fn=score).search(
            evaluator.scenario, config, lo, top, margin=evaluator.margin, check_to=hi)
        outcome = CapacityOutcome(answer.replicas, dict(config), label, lo, hi, dict(runs),
                                  lucky=answer.lucky, gave_up=answer.gave_up,
                                  checked=answer.checked)
        outcomes.append(outcome)
        if best is None or answer.replicas is not None:
            best = outcome
    assert best is not None
    if best.replicas is None:
        best = min(outcomes, key=_closeness)  # ties: the earlier candidate
    others = tuple((o.label, o.tried) for o in outcomes if o is not best)
    return dataclasses.replace(best, searched=tuple(searched),
                               floors=floors if best.replicas is None else (), others=others)


def _floors(evaluator: RobustEvaluator, configs: Sequence[Mapping[str, Any]],
            book: FloorBook | None = None) -> tuple[IdleFloor, ...]:
    """Each TTFT-limited class's idle floor (on a trace, or an open-loop workload's seeds),
    the lowest over ``configs`` (so a floor past its limit is past it on every
    candidate's knobs)."""
    if book is None:
        plan = None if isinstance(evaluator.scenario.workload, TraceSpec) else evaluator.plan
        book = FloorBook(evaluator.scenario, evaluator.slo, plan)
    lowest: dict[str, IdleFloor] = {}
    for config in configs:
        for f in book.of(config):
            if f.cls not in lowest or f.ttft_ms < lowest[f.cls].ttft_ms:
                lowest[f.cls] = f
    return tuple(lowest.values())


def _climb(lo: int, hi: int) -> int:
    """How many counts ``CapacityPlanner.search`` replays where none holds: ``lo``, then
    doubling up to ``hi``."""
    n, counts = lo, 1
    while n < hi:
        n, counts = min(hi, 2 * n), counts + 1
    return counts
