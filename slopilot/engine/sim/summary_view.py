"""How ``slopilot simulate`` shows a run: its table, and the SLO verdicts its JSON adds.

Two questions a reader asks are kept apart: how many *requests* were within their SLO
(each request by ``ClassSLO.met``: its TTFT and its own token gaps within the targets),
and whether the class's *P99* is within the SLO, the term an alert and the tuner judge.
A class can have 99.5 % of its requests within the SLO and a P99 that misses it.
"""

from __future__ import annotations

import sys
from typing import Any

from slopilot.engine.latency_buckets import TOKEN_LATENCY_BUCKETS
from slopilot.engine.request import Priority
from slopilot.engine.slo import ClassSLO, SLOSpec
from slopilot.engine.window_summary import ClassFigures, WindowSummary

GOODPUT_DEFINITION = (
    "goodput: tokens per second of the requests that met their class's SLO (TTFT within "
    "the target and at most 1 % of their token gaps above the TBT target; best-effort "
    "classes count every finished request); 'out' counts output tokens, 'all' prompt and "
    "output tokens")


def p99_within_slo(figures: ClassFigures, slo: ClassSLO) -> bool | None:
    """Whether the class's TTFT and TBT P99s meet its targets; None without traffic or
    without targets (best effort)."""
    if slo.best_effort or figures.ttft_p99_ms is None:
        return None
    ttft_ok = slo.ttft_p99_ms is None or figures.ttft_p99_ms <= slo.ttft_p99_ms
    tbt_ok = (slo.tbt_p99_ms is None or figures.tbt_p99_ms is None
              or figures.tbt_p99_ms <= slo.tbt_p99_ms)
    return ttft_ok and tbt_ok


def simulate_json(summary: WindowSummary, slo: SLOSpec) -> dict[str, Any]:
    """``summary.to_dict()`` plus, per class, the SLO targets and the P99 verdict."""
    out = summary.to_dict()
    verdicts = []
    for p, target in slo.classes().items():
        verdict = p99_within_slo(summary.classes[p], target)
        out["classes"][p.label].update(
            p99_within_slo=verdict, slo_ttft_p99_ms=target.ttft_p99_ms,
            slo_tbt_p99_ms=target.tbt_p99_ms)
        if verdict is not None:
            verdicts.append(verdict)
    out["p99_within_slo"] = all(verdicts) if verdicts else None
    return out


TTFT_FLOOR_MS = TOKEN_LATENCY_BUCKETS[-1] * 1000.0
"""What a TTFT percentile reads past the histogram's last finite edge: in the simulator,
one that falls among the requests refused for load (``sim.stats.REFUSED_TTFT_S``); live,
``histogram_quantile`` in the +Inf bucket. Either way at least this, not a time measured."""
TTFT_FLOOR = f"≥{TTFT_FLOOR_MS / 1000:.0f} s"


def _ms(value: float | None, digits: int) -> str:
    """A latency cell; "-" where the class had no samples (the summary's None)."""
    if value is None:
        return "-"
    return f"{value / 1000:.1f} s" if value >= 10_000 else f"{value:.{digits}f} ms"


def _ttft_percentile(value: float | None) -> str:
    # "300.0 s" read as a time measured, under a title of 60 s simulated.
    return TTFT_FLOOR if value == TTFT_FLOOR_MS else _ms(value, 0)


def _verdict(figures: ClassFigures, target: ClassSLO | None) -> str:
    if target is None:
        return "-"
    if target.best_effort:
        return "no SLO"
    verdict = p99_within_slo(figures, target)
    if verdict is None:
        return "-"
    if verdict:
        return "yes"
    missed = [name for name, value, limit in (
        ("TTFT", figures.ttft_p99_ms, target.ttft_p99_ms),
        ("TBT", figures.tbt_p99_ms, target.tbt_p99_ms))
        if value is not None and limit is not None and value > limit]
    return "no (" + ", ".join(missed) + ")"


def _row(name: str, c: ClassFigures, target: ClassSLO | None) -> list[str]:
    a = c.accounting
    arrived = a.requests_arrived if a is not None else None
    if arrived == 0 or (arrived is None and not c.requests_finished):
        return [name, "0", *["-"] * 12]
    s = c.samples
    met = c.slo_attainment
    return [
        name, "-" if arrived is None else f"{arrived:,}", f"{c.requests_finished:,.0f}",
        "-" if a is None else f"{a.requests_unfinished:,}",
        "-" if a is None else f"{a.requests_rejected:,}",
        _ms(s.ttft_mean_ms if s else None, 0), _ttft_percentile(c.ttft_p99_ms),
        _ms(c.tbt_p99_ms, 1), _ms(s.max_stall_ms if s else None, 1),
        f"{c.throughput_tok_s:,.0f}", f"{c.goodput_tok_s:,.0f}",
        "-" if a is None else f"{a.goodput_all_tok_s:,.0f}",
        "-" if met is None else f"{met:.1%}", _verdict(c, target)]


COLUMNS = ("class", "arrived", "finished", "unfinished", "rejected", "TTFT mean", "TTFT p99",
           "TBT p99", "max stall", "out tok/s", "goodput out", "goodput all",
           "requests within SLO", "p99 within SLO")
"""The per-class table's columns, in ``rows``' order (``simulate``, ``tune`` and the
tuning report print the same table)."""


def rows(summary: WindowSummary, slo: SLOSpec) -> list[list[str]]:
    """The table's cells: one row per class, then every class together."""
    targets = slo.classes()
    return ([_row(p.label, summary.classes[p], targets[p]) for p in Priority]
            + [_row("all", summary.overall, None)])


def print_summary(summary: WindowSummary, slo: SLOSpec, *, title: str | None = None,
                  console: Any = None, note: str = "") -> None:
    """``note``: said after the default title (``simulate``: what a trace replays)."""
    from rich.console import Console
    from rich.table import Table

    cfg = summary.run.config if summary.run is not None else {}
    replicas = summary.replicas or 1
    table = Table(title=title or (
        f"{summary.run.scenario if summary.run else 'run'}: {summary.duration_s:,.0f} s "
        f"simulated, {replicas} replica{'s' if replicas != 1 else ''}, "
        f"budget {cfg.get('token_budget')}, "
        f"chunk {cfg.get('chunk_size')}" + (f"; {note}" if note else "")))
    for col in COLUMNS:
        table.add_column(col, justify="right")
    for row in rows(summary, slo):
        table.add_row(*row)
    console = console or Console(width=None if sys.stdout.isatty() else 180)
    console.print(table)
    for line in footer(summary):
        console.print(line, highlight=False)


DEFINITIONS = (
    "requests within SLO: the share of finished requests that met their SLO; p99 within "
    "SLO: the class's TTFT and TBT P99s against its targets", GOODPUT_DEFINITION)


def footer(summary: WindowSummary, *, definitions: bool = True) -> list[str]:
    """The lines under the table: engine figures, censoring, the column definitions."""
    lines = []
    e = summary.engine
    busy = summary.busy_ratio
    busy_max = summary.busy_ratio_max if summary.busy_ratio_max is not None else busy
    text = f"preemptions/min {summary.preemptions_per_min:.1f}"
    if e is not None:
        text += (f" (recompute {e.preemptions_per_min_recompute:.1f}, "
                 f"swap {e.preemptions_per_min_swap:.1f})")
    # A live window has no busy ratio: read as 0 % it said the replicas serving the
    # table's tokens were idle.
    text += ("; busy per replica not measured" if busy is None else
             f"; busy per replica {busy:.0%} mean, {busy_max or 0.0:.0%} max")
    if e is not None:
        text += f"; KV mean {e.kv_usage_mean:.0%} max {e.kv_usage_max:.0%}"
    if summary.run is not None:
        text += f"; prefix hits {summary.run.prefix_hit_rate:.0%}"
    if e is not None:
        text += f"; {e.iterations:,} iterations"
    lines.append(text)
    if summary.run is not None and summary.run.twin:
        lines.append(f"twin: {summary.run.twin}")
    a = summary.overall.accounting
    if a is not None and a.ttft_censored:
        lines.append(f"{a.ttft_censored:,} request(s) had no first token when the run ended: "
                     "their TTFT counts as the time they had waited (a lower bound)")
    refused = summary.overall.requests_refused
    too_long = a.requests_rejected - refused if a is not None else 0
    if too_long > 0:
        lines.append(f"{too_long:,.0f} request(s) rejected as too long: prompt plus output "
                     "past the model's context or this deployment's KV cache (the server's "
                     "400); no TTFT figure counts them")
    if refused > 0:
        lines.append(_refused_line(summary, refused))
    return lines + list(DEFINITIONS) if definitions else lines


def _refused_line(summary: WindowSummary, refused: float) -> str:
    """Requests turned away for load: their share, and what they do to the TTFT figures
    (ranked past every measured TTFT, left out of the mean)."""
    shares = [f"{p.label} {_share(c)}" for p, c in summary.classes.items()
              if c.requests_refused > 0 and _share(c)]
    overall = _share(summary.overall)
    share = f", {overall} of those that arrived ({', '.join(shares)})" if overall else ""
    return (f"{refused:,.0f} request(s) refused for load (a full waiting queue, the "
            f"server's 429){share}: never given a first token, they rank past every "
            f"measured TTFT, and a TTFT percentile that falls among them shows "
            f"'{TTFT_FLOOR}' (the TTFT histogram's top edge, where the live P99 reads "
            "them), not a time measured; the TTFT mean is of the measured requests alone")


def _share(c: ClassFigures) -> str:
    a = c.accounting
    if a is None or not a.requests_arrived:
        return ""
    return f"{c.requests_refused / a.requests_arrived:.0%}"
