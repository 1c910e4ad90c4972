"""The start config beside the best trial: the table ``slopilot tune`` prints and its
report carries (a reviewer found the start-vs-best figures on the terminal only, and
report.md's "keep the start config" or "trial N" with nothing beside it to weigh), one
builder for both so that neither drifts from the other."""

from __future__ import annotations

from dataclasses import dataclass

from slopilot.engine.request import Priority
from slopilot.tuner.study.objective import TrialResult
from slopilot.tuner.study.verdict import (
    deciding_goodput,
    judged_where,
    share_text,
    term_label,
)
from slopilot.tuner.tune.outcome import TuneOutcome


@dataclass(frozen=True)
class Comparison:
    title: str
    columns: tuple[str, str, str]
    rows: tuple[tuple[str, str, str], ...]

    def markdown(self) -> list[str]:
        """The table as report.md's lines, its title a paragraph above it."""
        return [f"{self.title}:", "", "| " + " | ".join(self.columns) + " |",
                "|---|---|---|", *("| " + " | ".join(row) + " |" for row in self.rows)]


def comparison(outcome: TuneOutcome) -> Comparison | None:
    """The start config beside the best trial, titled by which of them is recommended;
    None where no trial completed."""
    if outcome.best_trial is None:
        return None
    n, best = outcome.best_trial
    start = outcome.start
    kept = outcome.best.is_start
    where = judged_where([start, best])
    title = (f"The start config (kept) against trial {n}, the best trial (each term in "
             f"{where})" if kept else
             f"Best config against the scenario's start config (each term in {where})")
    rows = [("holds SLO", "yes" if start.feasible else "no", "yes" if best.feasible else "no"),
            # What the study maximizes, and what a tie is on (outcome.TIE_MARGIN).
            ("goodput share" + (", worst window" if where == "its worst window" else ""),
             _share(start), _share(best)),
            ("goodput tok/s, deciding window", f"{deciding_goodput(start):,.0f}",
             f"{deciding_goodput(best):,.0f}"),
            ("goodput tok/s, mean of windows", f"{start.goodput_tok_s:,.0f}",
             f"{best.goodput_tok_s:,.0f}")]
    for i, name in enumerate(best.constraint_names):
        rows.append((f"{term_label(name)[0]} (of limit)", share_text(name, start.constraints[i]),
                     share_text(name, best.constraints[i])))
    for p in Priority:
        for key, label in (("ttft_p99_ms", "TTFT p99"), ("tbt_p99_ms", "TBT p99")):
            values = [max((getattr(w.result.summary.classes[p], key) or 0.0
                           for w in r.windows if w.result.summary is not None), default=None)
                      if r.windows else None for r in (start, best)]
            if any(values):
                rows.append((f"{p.label.upper()} {label}", _ms(values[0]), _ms(values[1])))
    for knob in outcome.tuner.space.bounds:
        rows.append((knob, knob_text(start.config.get(knob, "-")),
                     knob_text(best.config.get(knob))))
    return Comparison(title, ("", "start", f"trial {n}" if kept else "best"), tuple(rows))


def _share(r: TrialResult) -> str:
    return "-" if r.objective is None else f"{r.objective:.1%}"


def _ms(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v / 1000:.1f} s" if v >= 1000 else f"{v:.0f} ms"


def knob_text(v: object) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)
