"""The files a ``simulate`` or ``tune`` run reads, named by the flags that led to them,
for ``output_paths.check_distinct``: what none of the run's outputs may overwrite.

The flags name some (``--scenario FILE``, ``--trace``, ``--profile``); a scenario file
names others itself (its workload's trace, an empirical length distribution's trace in
any field and phase, its ``profile:``: ``Scenario.reads``), said as the scenario's.
"""

from __future__ import annotations

from pathlib import Path

from slopilot.engine.sim.output_paths import NamedFile
from slopilot.engine.sim.scenario import Scenario
from slopilot.engine.sim.workload_spec import TraceSpec


def run_inputs(scenario: Scenario, *, scenario_arg: str | None, trace_arg: str | None,
               profile_arg: str | None) -> list[NamedFile]:
    """The run's input files: the flags' first, so that a clash names the flag given.
    Names that are no file (a shipped scenario or trace) are left to ``check_distinct``,
    which skips what does not exist."""
    named = [NamedFile(flag, value) for flag, value in (
        ("--scenario", scenario_arg), ("--trace", trace_arg), ("--profile", profile_arg))
        if value]
    owner = scenario_arg or scenario.name
    # Every file its parse read (an empirical length's trace too, in any phase), and
    # the trace and profile of a scenario built otherwise (a workload swapped in).
    named += [NamedFile("--scenario", owner, path) for path in scenario.reads]
    if isinstance(scenario.workload, TraceSpec):
        named.append(NamedFile("--scenario", owner, Path(scenario.workload.trace)))
    if scenario.profile is not None:
        named.append(NamedFile("--scenario", owner, Path(scenario.profile.source)))
    return named


def metrics_files(path: str | Path, replicas: int) -> list[Path]:
    """What ``simulate --metrics-out PATH`` writes: PATH for one replica, else one
    ``PATH-rN`` file per replica (``.prom`` where PATH has no suffix)."""
    target = Path(path)
    if replicas == 1:
        return [target]
    return [target.with_name(f"{target.stem}-r{i}{target.suffix or '.prom'}")
            for i in range(replicas)]
