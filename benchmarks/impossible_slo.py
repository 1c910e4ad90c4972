"""An SLO no replica count holds: how many replicas does the loop buy, and keep?

tiny-cpu's shape (1 x A100 a replica, Llama-3-8B, lognormal lengths, no shift) at a
steady 3 Poisson requests a second, its P0 TTFT limit set to ``--ttft-ms`` (50: below
what one long prompt's prefill takes alone, so no count holds it), under the production
``Controller`` at operator defaults (``max_replicas`` ``--max-replicas``) over a
``SimCluster``, in virtual time, started on 1 replica and on ``--max-replicas``. Beside
it, each count served statically (``--static-s`` each): the worst SLO term's share of its
limit, the figure that says whether more replicas help.

Reported per start: the replica path (minute: count at each change), the loop's actions,
the 60 s windows that missed the SLO (judged on the plant) and the replica-minutes. One
RESULT line at the end: the replicas each start ended on, and the replica-minutes.

    .venv/bin/python benchmarks/impossible_slo.py [--ttft-ms 50] [--minutes 30] [--seed 0]
"""

from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path
from typing import Any

import yaml

from slopilot.engine.sim.cluster import SimCluster
from slopilot.engine.sim.scenario import Scenario, parse_scenario
from slopilot.engine.sim.simulator import simulate
from slopilot.tuner.loop.capacity import CapacityPlanner
from slopilot.tuner.loop.controller import Controller
from slopilot.tuner.loop.decision import Action
from slopilot.tuner.loop.settings import ControllerSettings
from slopilot.tuner.prometheus.rules import RuleOptions
from slopilot.tuner.sim.adapters import SimAlerts, SimDeployment, SimOffline, SimProbe, SimWindows
from slopilot.tuner.study.objective import score
from slopilot.tuner.study.space import SearchSpace
from slopilot.tuner.study.storage import open_study
from slopilot.tuner.study.tuner import Tuner

ROOT = Path(__file__).resolve().parents[1]
TICK_S = 15.0
WINDOW_S = 60.0


def scenario(ttft_ms: float, minutes: float) -> Scenario:
    """tiny-cpu without its shift, 3 Poisson requests a second, P0 TTFT at ``ttft_ms``."""
    data: dict[str, Any] = copy.deepcopy(yaml.safe_load(
        (ROOT / "slopilot/data/scenarios/tiny-cpu.yaml").read_text()))
    data["name"], data["duration_s"] = "impossible", minutes * 60
    data["workload"].pop("shift")
    data["workload"]["arrivals"] = {"process": "poisson", "rate": 3}
    data["slo"]["classes"]["p0"]["ttft_p99_ms"] = ttft_ms
    return parse_scenario(data, source="impossible (tiny-cpu shape)")


def loop(sc: Scenario, replicas: int, max_replicas: int, seed: int) -> dict[str, Any]:
    """The loop over ``sc`` from ``replicas``: its path, actions, breached windows and
    replica-minutes."""
    cluster = SimCluster(sc, dict(sc.engine), replicas=replicas, seed=seed)
    space = SearchSpace.from_bounds(base=sc.engine_config())
    st = ControllerSettings(deployment="impossible", slo=sc.slo, max_replicas=max_replicas)
    ctl = Controller(st, SimDeployment(cluster), SimAlerts(cluster, RuleOptions()),
                     SimWindows(cluster, min_requests=10),
                     Tuner(open_study(None, "live", seed=seed), space),
                     SimProbe(cluster, window_s=st.window_s), CapacityPlanner(seed=seed),
                     offline=SimOffline(space, seed=seed))
    path, actions, replica_min, t = [(0.0, replicas)], [], 0.0, 0.0
    began = time.perf_counter()
    while t < sc.duration_s:
        replica_min += len(cluster.active) * TICK_S / 60
        t += TICK_S
        cluster.advance(t)
        d = ctl.tick(t)
        if d.action is not Action.NONE:
            actions.append(f"{t / 60:6.2f} min {d.action.name} {d.reason[:150]}")
        if len(cluster.active) != path[-1][1]:
            path.append((t, len(cluster.active)))
    windows = [score(cluster.summary(w, w + WINDOW_S), sc.slo).feasible
               for w in range(0, int(cluster.now - WINDOW_S) + 1, int(WINDOW_S))]
    return {"path": path, "actions": actions, "replica_min": replica_min,
            "breached": sum(not ok for ok in windows), "windows": len(windows),
            "wall_s": time.perf_counter() - began}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ttft-ms", type=float, default=50.0)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--max-replicas", type=int, default=8)
    parser.add_argument("--static-s", type=float, default=300.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    sc = scenario(args.ttft_ms, args.minutes)
    counts = [n for n in (1, 2, 4, 8, 16) if n <= args.max_replicas]
    for n in counts:
        r = score(simulate(sc, dict(sc.engine), replicas=n, duration_s=args.static_s,
                           seed=args.seed).summary, sc.slo)
        print(f"static {n} replica(s): worst term at {max(r.constraints) + 1:.0%} of its "
              f"limit, feasible {r.feasible}")
    ended: dict[int, tuple[int, float]] = {}
    for start in (1, args.max_replicas):
        out = loop(sc, start, args.max_replicas, args.seed)
        path = " ".join(f"{t / 60:.2f}:{n}" for t, n in out["path"])
        print(f"from {start}: path (min:replicas) {path}; {out['breached']}/{out['windows']} "
              f"windows breached; {out['replica_min']:.1f} replica-minutes; "
              f"{out['wall_s']:.0f} s wall")
        for line in out["actions"]:
            print(f"    {line}")
        ended[start] = (out["path"][-1][1], out["replica_min"])
    (lo, (lo_end, lo_rm)), (hi, (hi_end, hi_rm)) = sorted(ended.items())
    print(f"RESULT ttft_ms={args.ttft_ms:g} max_replicas={args.max_replicas} "
          f"from_{lo}_ended={lo_end} from_{lo}_replica_min={lo_rm:.1f} "
          f"from_{hi}_ended={hi_end} from_{hi}_replica_min={hi_rm:.1f}")


if __name__ == "__main__":
    main()
