"""What a plot shows, written on the plot: a PNG travels alone (pasted into a doc, an
issue, a chat), and its reader must know which workload it ran, on which twin, from
which run, without the report.md beside it.

Every figure builder of the reports (``report_plots.py``, the demo's timeline, the twin
fidelity benchmark's plot) takes a ``PlotSubject`` and hands it to ``name_figure``,
which writes it into the figure's suptitle."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import Any

from slopilot.engine.sim.scenario import Scenario
from slopilot.engine.sim.twin import twin_label
from slopilot.engine.sim.workload_spec import TraceSpec

# Characters of the subtitle's font that fit one inch of figure (DejaVu Sans at 8 pt is
# about 4.6 pt wide a character, so about 15 an inch; a little under keeps a margin).
_CHARS_PER_INCH = 14


@dataclass(frozen=True)
class PlotSubject:
    workload: str
    """What was served: ``scenario tiny-cpu``, ``trace FILE``, a generated load."""
    twin: str
    """The cost model the twin ran on: the model and ``twin_label`` (datasheet or
    calibrated profile)."""
    run: str
    """Which run drew it: the command that reproduces it, or its date and options."""
    replicas: int | None = None
    """The replica count every point was simulated on, when one count holds for all
    (``tune``'s study: its recommendation may be on more, which these plots do not show);
    None: not said (a plot of several counts, or of a live fleet)."""

    @classmethod
    def of(cls, scenario: Scenario, run: str, replicas: int | None = None) -> PlotSubject:
        """A scenario's subject: its name (and trace), and its twin's cost model."""
        workload = f"scenario {scenario.name}"
        if isinstance(scenario.workload, TraceSpec):
            workload += f", trace {scenario.workload.trace}"
        return cls(workload, f"{scenario.model} on {twin_label(scenario)}", run, replicas)

    def lines(self) -> list[str]:
        twin = f"twin: {self.twin}"
        if self.replicas is not None:
            twin += f", on {self.replicas} replica{'s' if self.replicas != 1 else ''}"
        return [f"workload: {self.workload}", twin, f"run: {self.run}"]


def name_figure(fig: Any, subject: PlotSubject, title: str | None = None) -> None:
    """Write ``title`` (when given) and ``subject`` into ``fig``'s suptitle, each line
    wrapped to the figure's width so that none is clipped at its edges."""
    width = max(40, int(fig.get_figwidth() * _CHARS_PER_INCH))
    lines = [title] if title else []
    for line in subject.lines():
        lines += textwrap.wrap(line, width, subsequent_indent="    ")
    fig.suptitle("\n".join(lines), fontsize=8, linespacing=1.3)
