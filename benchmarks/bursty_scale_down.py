"""A bursty load planned as Poisson: does the loop give back replicas the bursts need?

tiny-cpu's shape (1 x A100 a replica, Llama-3-8B, lognormal lengths, no shift) at
``--rate`` requests a second with gamma gaps of cv ``--cv`` (bursts, as production traces
show), served by ``REPLICAS`` (6) replicas under the production ``Controller`` at operator
defaults over a ``SimCluster``, in virtual time. "Before": the workload probe plans every
load as Poisson at its rate (``SimProbe(poisson_only=True)``), as before the burstiness was
measured; "after": the probe reads the arrivals' cv from 15 s bins (``burstiness.py``),
the twin plans gamma arrivals and the capacity runs hold cv^2 times the floor. A smooth
control (Poisson arrivals, same rate) shows the decisions it left alone.

Reported per run: the replica path (time: count at each change), the windows
(``WINDOW_S``) after the first scale-down that broke the SLO (judged on the plant), those
from the loop's first look at fewer replicas (15 min) to the end, whether it scaled down
or not, and the minutes from the first breach after a scale-down to the first scale-up.
One RESULT line at the end.

    .venv/bin/python benchmarks/bursty_scale_down.py [--minutes 30] [--seeds 0 1 2]
"""

from __future__ import annotations

import argparse
import copy
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from slopilot.engine.sim.cluster import SimCluster
from slopilot.engine.sim.scenario import Scenario, parse_scenario
from slopilot.tuner.loop.capacity import CapacityPlanner
from slopilot.tuner.loop.controller import Controller
from slopilot.tuner.loop.decision import Action, Decision
from slopilot.tuner.loop.settings import ControllerSettings
from slopilot.tuner.prometheus.rules import RuleOptions
from slopilot.tuner.sim.adapters import SimAlerts, SimDeployment, SimOffline, SimProbe, SimWindows
from slopilot.tuner.study.objective import score
from slopilot.tuner.study.sample_floor import SIM_MAX_DURATION_S
from slopilot.tuner.study.space import SearchSpace
from slopilot.tuner.study.storage import open_study
from slopilot.tuner.study.tuner import Tuner

ROOT = Path(__file__).resolve().parents[1]
TICK_S = 15.0
WINDOW_S = 120.0
RATE = 6.0
CV = 4.0
REPLICAS = 6
SCALE_DOWN_AFTER_S = 900.0
"""``ControllerSettings.scale_down_after_s``'s default: the loop's first look at fewer."""


def scenario(rate: float, cv: float | None, minutes: float) -> Scenario:
    """tiny-cpu without its shift, gamma arrivals of ``cv`` (None: Poisson)."""
    data: dict[str, Any] = copy.deepcopy(yaml.safe_load(
        (ROOT / "slopilot/data/scenarios/tiny-cpu.yaml").read_text()))
    data["name"], data["duration_s"] = "bursty", minutes * 60
    data["workload"].pop("shift")
    data["workload"]["arrivals"] = ({"process": "poisson", "rate": rate} if cv is None
                                    else {"process": "gamma", "rate": rate, "cv": cv})
    return parse_scenario(data, source="bursty (tiny-cpu shape)")


@dataclass
class Run:
    cluster: SimCluster
    controller: Controller
    decisions: list[tuple[float, Decision]] = field(default_factory=list)
    path: list[tuple[float, int]] = field(default_factory=list)
    """(time, replicas) at the start and at each change."""


def start(sc: Scenario, seed: int, *, poisson_plan: bool, replicas: int = REPLICAS,
          max_duration_s: float = SIM_MAX_DURATION_S, **settings: Any
          ) -> tuple[Run, Iterator[float]]:
    """The loop at operator defaults (but for ``settings``) over ``sc`` on ``replicas``;
    the iterator ticks it once per ``TICK_S`` of virtual time and yields the time."""
    cluster = SimCluster(sc, dict(sc.engine), replicas=replicas, seed=seed)
    space = SearchSpace.from_bounds(base=sc.engine_config())
    st = ControllerSettings(deployment="bursty", slo=sc.slo, max_replicas=2 * replicas,
                            **settings)
    ctl = Controller(st, SimDeployment(cluster), SimAlerts(cluster, RuleOptions()),
                     SimWindows(cluster, min_requests=10),
                     Tuner(open_study(None, "live", seed=seed), space),
                     SimProbe(cluster, window_s=st.window_s,
                              poisson_only=poisson_plan),
                     CapacityPlanner(seed=seed, max_duration_s=max_duration_s),
                     offline=SimOffline(space, seed=seed))
    run = Run(cluster, ctl, path=[(0.0, replicas)])

    def ticks() -> Iterator[float]:
        t = 0.0
        while t < sc.duration_s:
            t += TICK_S
            cluster.advance(t)
            d = ctl.tick(t)
            if d.action is not Action.NONE:
                run.decisions.append((t, d))
            if len(cluster.active) != run.path[-1][1]:
                run.path.append((t, len(cluster.active)))
            yield t
    return run, ticks()


def judged(run: Run, sc: Scenario) -> dict[str, Any]:
    """The replica path, and the windows after the first scale-down that broke the SLO."""
    path = run.path
    downs = [t for t, d in run.decisions if d.action is Action.SCALE
             and d.reason.startswith("scale_down")]
    end = run.cluster.now
    breached, windows, climb = 0, 0, None
    if downs:
        w = downs[0]
        first_breach = None
        while w + WINDOW_S <= end:
            windows += 1
            if not score(run.cluster.summary(w, w + WINDOW_S), sc.slo).feasible:
                breached += 1
                first_breach = w if first_breach is None else first_breach
            w += WINDOW_S
        ups = [t for t, d in run.decisions if d.action is Action.SCALE
               and d.reason.startswith("scale_up") and t > downs[0]]
        if first_breach is not None and ups:
            climb = (ups[0] - first_breach) / 60
    # Every window from the first look at fewer replicas on: the same span for a run
    # that scaled down and one that kept its replicas.
    late = [score(run.cluster.summary(w, w + WINDOW_S), sc.slo).feasible
            for w in np.arange(SCALE_DOWN_AFTER_S, end - WINDOW_S + 1e-9, WINDOW_S)]
    return {"path": path, "min_replicas": min(c for _, c in path),
            "breached": breached, "windows": windows, "climb_min": climb,
            "late_breached": sum(not ok for ok in late), "late_windows": len(late)}


def one(rate: float, cv: float | None, minutes: float, seed: int, *,
        poisson_plan: bool, max_duration_s: float = SIM_MAX_DURATION_S) -> dict[str, Any]:
    sc = scenario(rate, cv, minutes)
    run, ticks = start(sc, seed, poisson_plan=poisson_plan, max_duration_s=max_duration_s)
    began = time.perf_counter()
    for _ in ticks:
        pass
    out = judged(run, sc)
    out["wall_s"] = time.perf_counter() - began
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", type=float, default=RATE)
    ap.add_argument("--cv", type=float, default=CV)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--no-control", action="store_true", help="skip the smooth control")
    ap.add_argument("--max-duration-s", type=float, default=SIM_MAX_DURATION_S,
                    help="the capacity runs' cap (the operator's: an hour); a lower one "
                         "runs faster where the bursty runs reach it short either way")
    a = ap.parse_args()
    loads: list[tuple[str, float | None]] = [("bursty", a.cv)]
    if not a.no_control:
        loads.append(("smooth", None))
    totals: dict[str, list[dict[str, Any]]] = {}
    for name, cv in loads:
        for plan, poisson in (("before", True), ("after", False)):
            for seed in a.seeds:
                r = one(a.rate, cv, a.minutes, seed, poisson_plan=poisson,
                        max_duration_s=a.max_duration_s)
                totals.setdefault(f"{name}_{plan}", []).append(r)
                path = " ".join(f"{t / 60:.0f}m:{n}" for t, n in r["path"])
                climb = "-" if r["climb_min"] is None else f"{r['climb_min']:.0f} min"
                print(f"{name:6s} {plan:6s} seed {seed}: replicas {path}; "
                      f"{r['breached']}/{r['windows']} windows breached after the first "
                      f"scale-down, {r['late_breached']}/{r['late_windows']} from 15 min on; "
                      f"climb {climb} ({r['wall_s']:.0f} s wall)", flush=True)
    fields = [f"rate={a.rate:g}", f"cv={a.cv:g}", f"minutes={a.minutes:g}",
              f"seeds={len(a.seeds)}", f"cap_s={a.max_duration_s:g}"]
    for key, runs in totals.items():
        fields += [f"{key}_min_replicas={min(r['min_replicas'] for r in runs)}",
                   f"{key}_breached={sum(r['breached'] for r in runs)}/"
                   f"{sum(r['windows'] for r in runs)}",
                   f"{key}_late_breached={sum(r['late_breached'] for r in runs)}/"
                   f"{sum(r['late_windows'] for r in runs)}"]
    if "smooth_before" in totals:
        same = [b["path"] == f["path"] for b, f in zip(totals["smooth_before"],
                                                       totals["smooth_after"], strict=True)]
        fields.append(f"smooth_paths_unchanged={sum(same)}/{len(same)}")
    print("RESULT " + " ".join(fields))


if __name__ == "__main__":
    main()
