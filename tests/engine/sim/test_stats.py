"""What a simulated run counts: requests arriving in the measured window, followed to the
run's horizon; unfinished ones censored into TTFT and counted; busy per replica; goodput
of output and of all tokens; rejected prompts per class."""

from __future__ import annotations

import pytest

from slopilot.engine.request import Priority, Request
from slopilot.engine.sim.scenario import load_scenario
from slopilot.engine.sim.simulator import Measure, simulate
from slopilot.engine.sim.stats import REFUSED_TTFT_S, ttft_percentile_ms
from slopilot.engine.sim.trace import TraceRecord, TraceWorkload

SCENARIO = load_scenario("tiny-cpu")


def replay(records: list[TraceRecord]) -> TraceWorkload:
    return TraceWorkload(records, classes=None)


def test_a_request_still_waiting_at_the_end_is_censored_into_ttft() -> None:
    # One short request, then a prompt so long that its prefill cannot end in 1 s
    # at a 64-token chunk (~1.2 s): without censoring TTFT p99 would be the short one's alone.
    records = [TraceRecord(0.0, 32, 4, Priority.P1), TraceRecord(0.5, 7000, 4, Priority.P1)]
    run = simulate(SCENARIO, {"token_budget": 256, "chunk_size": 64}, duration_s=1.0,
                   workload=replay(records))
    p1 = run.summary.classes[Priority.P1]
    assert p1.requests_finished == 1
    assert p1.accounting is not None
    assert p1.accounting.requests_unfinished == 1 and p1.accounting.ttft_censored == 1
    assert p1.ttft_p99_ms is not None and p1.ttft_p99_ms > 450.0  # ~ 1.0 - 0.5 s
    assert run.summary.overall.accounting is not None
    assert run.summary.overall.accounting.requests_unfinished == 1


def test_only_requests_arriving_inside_the_window_are_counted() -> None:
    records = [TraceRecord(float(t), 64, 8, Priority.P1) for t in range(0, 30)]
    run = simulate(SCENARIO, measure=Measure(start_s=10.0, end_s=20.0, horizon_s=25.0),
                   workload=replay(records))
    s = run.summary
    assert s.duration_s == 10.0
    assert s.overall.accounting is not None
    assert s.overall.accounting.requests_arrived == 10  # arrivals 10 .. 19
    assert s.overall.requests_finished == 10
    # Their output tokens over the window's length.
    assert s.overall.throughput_tok_s == pytest.approx(10 * 8 / 10.0)


def test_a_window_run_can_stop_once_its_requests_are_judged() -> None:
    # Arrivals go on past the window (they load the engine as live traffic would), but
    # once every request it counts has finished nothing left can change its figures: a
    # drain sized for requests living minutes costs only what they take.
    records = [TraceRecord(float(t), 64, 8, Priority.P1) for t in range(60)]
    measure = Measure(start_s=10.0, end_s=20.0, horizon_s=60.0)
    full = simulate(SCENARIO, measure=measure, workload=replay(records))
    reached: list[float] = []
    short = simulate(SCENARIO, measure=measure, workload=replay(records),
                     until_judged=True, progress=reached.append)
    assert short.summary == full.summary
    assert 19.0 < reached[-1] < 21.0  # where the last counted request (at 19 s) ended
    # One still running at the horizon: the run goes to the horizon, as without it.
    slow = [TraceRecord(0.0, 64, 8, Priority.P1), TraceRecord(15.0, 64, 8000, Priority.P1)]
    reached.clear()
    run = simulate(SCENARIO, measure=measure, workload=replay(slow), until_judged=True,
                   progress=reached.append)
    assert reached[-1] == 60.0
    assert run.summary == simulate(SCENARIO, measure=measure, workload=replay(slow)).summary


def test_busy_ratio_is_per_replica_mean_and_max() -> None:
    # One request on two replicas: one replica works, the other idles.
    records = [TraceRecord(0.0, 4000, 200, Priority.P1)]
    s = simulate(SCENARIO, replicas=2, duration_s=5.0, workload=replay(records)).summary
    assert s.busy_ratio is not None and s.busy_ratio_max is not None
    assert 0.0 < s.busy_ratio <= 1.0 and s.busy_ratio_max <= 1.0
    assert s.busy_ratio_max == pytest.approx(2 * s.busy_ratio)


def test_goodput_counts_output_tokens_and_all_tokens_of_requests_within_slo() -> None:
    records = [TraceRecord(float(t), 100, 10, Priority.P1) for t in range(5)]
    s = simulate(SCENARIO, duration_s=10.0, workload=replay(records)).summary
    p1 = s.classes[Priority.P1]
    assert p1.slo_attainment == 1.0
    assert p1.goodput_tok_s == pytest.approx(5 * 10 / 10.0)
    assert p1.accounting is not None
    assert p1.accounting.goodput_all_tok_s == pytest.approx(5 * 110 / 10.0)
    assert p1.accounting.offered_tok_s == pytest.approx(5 * 10 / 10.0)


def test_prompts_that_can_never_fit_are_rejected_per_class() -> None:
    records = [TraceRecord(0.0, 64, 4, Priority.P0), TraceRecord(0.1, 10**6, 4, Priority.P2)]
    s = simulate(SCENARIO, duration_s=3.0, workload=replay(records)).summary
    p2 = s.classes[Priority.P2].accounting
    assert p2 is not None and p2.requests_rejected == 1 and p2.requests_arrived == 1
    assert s.run is not None and s.run.rejected == 1
    assert s.classes[Priority.P0].requests_finished == 1


def test_measure_is_checked() -> None:
    with pytest.raises(ValueError, match="start_s <= end_s <= horizon_s"):
        Measure(start_s=5.0, end_s=4.0, horizon_s=6.0)


@pytest.mark.parametrize("knobs", [{}, {"max_num_seqs": 8, "max_waiting": 4}],
                         ids=["all-served", "some-turned-away"])
def test_the_exported_verdicts_are_the_summarys_goodput_request_by_request(
        knobs: dict[str, int]) -> None:
    """``simulate --metrics-out`` exports the per-request verdicts that the summary's
    goodput and attainment count: the same tokens, the same requests, per class. A
    request turned away for load is a miss in both (the summary's attainment left it
    out while the exported verdicts counted it)."""
    from prometheus_client.parser import text_string_to_metric_families

    from slopilot.engine.metric_names import REFUSED
    from slopilot.engine.request import Priority
    from slopilot.engine.sim.scenario import load_scenario
    from slopilot.engine.sim.simulator import simulate
    from slopilot.engine.verdicts import SLO_REQUESTS, SLO_TOKENS

    scenario = load_scenario("mixed-priority")
    run = simulate(scenario, {"token_budget": 4096, "chunk_size": 4096, **knobs},
                   duration_s=30, seed=3, with_metrics=True)
    exported: dict[tuple[str, str, str], float] = {}
    for text in run.metrics:
        for family in text_string_to_metric_families(text.decode()):
            for s in family.samples:
                if s.name == REFUSED:
                    key = (REFUSED, s.labels["priority_class"], "false")
                    exported[key] = exported.get(key, 0.0) + s.value
                elif s.name in (SLO_REQUESTS, SLO_TOKENS):
                    assert s.labels["slo"] == scenario.slo.class_slo(
                        s.labels["priority_class"]).label
                    key = (s.name, s.labels["priority_class"], s.labels["met"])
                    exported[key] = exported.get(key, 0.0) + s.value
    summary = run.summary
    judged_some = False
    for p in Priority:
        c = summary.classes[p]
        met = exported[(SLO_REQUESTS, p.label, "true")]
        judged = met + exported[(SLO_REQUESTS, p.label, "false")]
        assert exported[(SLO_TOKENS, p.label, "true")] == pytest.approx(
            c.goodput_tok_s * summary.duration_s)
        assert judged == c.requests_finished + exported[(REFUSED, p.label, "false")]
        if judged:
            judged_some = True
            assert met / judged == pytest.approx(c.slo_attainment)
    assert judged_some
    refused = sum(v for (name, _, _), v in exported.items() if name == REFUSED)
    assert (refused > 0) == bool(knobs)


def _burst(n: int, *, at: float = 0.0) -> list[TraceRecord]:
    return [TraceRecord(at + i * 1e-3, 64, 400, Priority.P1) for i in range(n)]


def test_requests_turned_away_for_load_are_first_tokens_never_given() -> None:
    """A full waiting queue turns requests away (429): their clients were never served,
    so the TTFT percentiles read each as a first token never given. Left out, as before,
    a config that turned away half its requests read the P99 of the other half, and held
    the SLO. More than 1 % turned away, the P99 is past anything measured: what
    ``histogram_quantile`` reads when a P99 falls in the +Inf bucket (the live side)."""
    knobs = {"max_num_seqs": 4, "max_waiting": 4}
    s = simulate(SCENARIO, knobs, duration_s=2.0, workload=replay(_burst(40))).summary
    p1 = s.classes[Priority.P1]
    assert p1.accounting is not None and p1.accounting.requests_rejected == 32
    assert p1.requests_refused == 32 and s.overall.requests_refused == 32
    assert p1.ttft_p99_ms == REFUSED_TTFT_S * 1000.0
    assert p1.samples is not None and p1.samples.ttft_p50_ms == REFUSED_TTFT_S * 1000.0
    assert s.overall.ttft_p99_ms == REFUSED_TTFT_S * 1000.0


def test_p0s_into_a_queue_full_of_p2_displace_p2s_counted_as_p2_refusals() -> None:
    """The twin admits as the engine does (``queue_room.py``): each P0 arriving at a
    queue full of P2 takes the place of the newest P2 not yet started, which counts as
    a P2 turned away, in the summary and in the exported series alike. Before, all four
    P0 were refused and counted P0 misses."""
    from prometheus_client.parser import text_string_to_metric_families

    from slopilot.engine.metric_names import REFUSED

    records = [TraceRecord(i * 1e-3, 64, 4000, Priority.P2) for i in range(12)]
    records += [TraceRecord(0.05 + i * 1e-3, 64, 4, Priority.P0) for i in range(4)]
    run = simulate(SCENARIO, {"max_num_seqs": 4, "max_waiting": 4}, duration_s=3.0,
                   workload=replay(records), with_metrics=True, check_integrity=True)
    s = run.summary
    # 4 P2 run, 4 wait, 4 are refused at the door; then each P0 displaces one waiting P2.
    assert s.classes[Priority.P0].requests_refused == 0
    assert s.classes[Priority.P0].requests_finished == 4
    assert s.classes[Priority.P2].requests_refused == 8
    p2 = s.classes[Priority.P2].accounting
    assert p2 is not None and (p2.requests_arrived, p2.requests_rejected) == (12, 8)
    assert s.run is not None and s.run.rejected == 8
    exported = {sample.labels["priority_class"]: sample.value
                for family in text_string_to_metric_families(run.metrics[0].decode())
                for sample in family.samples if sample.name == REFUSED}
    assert exported == {"p0": 0, "p1": 0, "p2": 8}


def test_a_prompt_that_can_never_fit_is_not_a_first_token_never_given() -> None:
    # A client error (400), not load: the P99 is the served requests'.
    records = [TraceRecord(0.0, 64, 4, Priority.P1), TraceRecord(0.1, 10**6, 4, Priority.P1)]
    p1 = simulate(SCENARIO, duration_s=3.0, workload=replay(records)).summary.classes[
        Priority.P1]
    assert p1.ttft_p99_ms is not None and p1.ttft_p99_ms < 1000.0


@pytest.mark.parametrize(("served", "refused", "expected"), [
    ([1.0, 2.0, 3.0], 0, 2.98),
    # 1 of 200 never served: the P99's rank (0.99 x 199 = 197.01) lies among the served.
    (list(map(float, range(1, 200))), 1, 197.01 + 1.0),
    # 2 of 100: the rank falls among those never served.
    (list(map(float, range(1, 99))), 2, REFUSED_TTFT_S),
    # 1 of 100, 10 of 1000: exactly 1 %, which the live P99 reads as the served ones'
    # (histogram_quantile: 99 % of all within the last finite bucket), and the docs'
    # "more than 1 %" says so; the twin read 300 s there and judged a miss live held.
    ([0.05] * 99, 1, 0.05),
    (list(map(float, range(1, 991))), 10, 990.0),
    ([], 3, REFUSED_TTFT_S),
    ([], 0, None),
])
def test_the_ttft_percentile_places_those_never_served_past_every_other(
        served: list[float], refused: int, expected: float | None) -> None:
    got = ttft_percentile_ms(served, refused, 99)
    assert (got is None) if expected is None else got == pytest.approx(expected * 1000.0)


def test_a_request_whose_output_can_never_fit_is_rejected_as_the_server_refuses_it() -> None:
    """The server refuses a request whose prompt plus max_tokens is more than its KV
    cache holds (400, context_length_exceeded), as no such request can ever finish. The
    twin admitted it while its prompt fit, to be cut at the cache's size or, here, never
    to finish: what the twin judged was a request no client of the server is served."""
    records = [TraceRecord(0.0, 64, 4, Priority.P0),
               TraceRecord(0.1, 64, 2**24 - 64, Priority.P2)]
    s = simulate(SCENARIO, duration_s=3.0, workload=replay(records)).summary
    p2 = s.classes[Priority.P2].accounting
    assert p2 is not None and p2.requests_rejected == 1 and p2.requests_arrived == 1
    assert p2.requests_unfinished == 0
    assert s.run is not None and s.run.rejected == 1
    assert s.classes[Priority.P0].requests_finished == 1


class _Outputs:
    """Each request's output length at each of its engine outputs (first token, gaps)."""

    def __init__(self) -> None:
        self.seen: dict[str, list[int]] = {}
        self.gaps: dict[str, int] = {}

    def on_step(self, *_: object) -> None:
        pass

    def on_first_token(self, req: Request, ttft_s: float, now: float) -> None:
        self.seen[req.request_id] = [req.num_output_tokens]

    def on_token_gap(self, req: Request, gap_s: float, now: float) -> None:
        self.seen[req.request_id].append(req.num_output_tokens)
        self.gaps[req.request_id] = self.gaps.get(req.request_id, 0) + 1

    def on_finished(self, req: Request, now: float) -> None:
        pass


def test_the_twin_counts_one_gap_an_engine_output_and_each_brings_one_token() -> None:
    """The live series count one gap a chunk that brings tokens (``ClientGaps``), vLLM's
    one an engine output; the twin's TBT P99 and verdicts count one a token
    (``SimStats.on_token_gap``, ``SLOJudge.finished``: output tokens - 1). The two are
    the same count only while each engine output of a request brings one token and is
    its own chunk: the twin models neither speculative decoding nor a server loop that
    merges outputs, so it must never emit more than one token an output. Held here,
    under a load that queues and batches prefills with decodes."""
    records = [TraceRecord(0.02 * i, 30 if i % 3 else 600, 40, Priority.P1)
               for i in range(120)]
    outputs = _Outputs()
    simulate(SCENARIO, {"max_num_seqs": 16, "chunk_size": 256}, duration_s=5.0,
             workload=replay(records), observers=[outputs])
    assert len(outputs.seen) == 120
    for rid, lengths in outputs.seen.items():
        assert lengths == list(range(1, len(lengths) + 1)), rid
        assert outputs.gaps.get(rid, 0) == len(lengths) - 1
