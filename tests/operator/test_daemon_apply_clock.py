"""The daemon's trial counts from when its config reached the pod, on the daemon's clock.

The daemon ticks its controller at ``clock()``; a trial's apply (a PUT to each pod) may
take seconds to minutes on a slow API server or pod, and its window used to start at
the tick's ``now``, measuring the config before it. The daemon passes its clock to the
tick, which reads it again once the apply has returned (``tests/tuner/test_apply_clock.py``
has the controller's side).
"""

from __future__ import annotations

import pytest

from tests.operator.operator_support import Cluster, add_pod, daemon_loop, llmd
from tests.operator.standins import PodStandIn, PrometheusStandIn, serving
from tests.operator.test_live_config import Clock, reconciled, spec_config
from tests.support.kube_server import RunningEmulator

PUT_S = 7.0
"""How long the pod takes to answer a config's PUT."""


def test_a_trials_window_starts_when_its_put_returned(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch) -> None:
    body, _, mint = reconciled(kube, cluster, llmd(
        prometheus={"url": prom.url}, engine={"tokenBudget": 1024}, tuning={"window": "1h"}))
    prom.fire("SlopilotTTFTP99High", "retune", "chat", body["metadata"]["namespace"])
    loop = daemon_loop(cluster, body, monkeypatch)
    clock = Clock()
    loop.clock = clock
    pod = PodStandIn(mint.for_body(cluster.get()), spec_config(cluster))
    put_returned: list[float] = []
    """When each config PUT was answered (the pod's SLO PUTs take no time here)."""

    def slow(method: str, path: str) -> None:
        if (method, path) == ("PUT", "/admin/config"):
            clock.now += PUT_S
            put_returned.append(clock.now)

    pod.on_request = slow
    with serving(pod):
        add_pod(cluster, "chat", 0, pod.port)
        ticked_at = clock.now
        assert loop.step()
    controller = loop.controller
    assert controller is not None
    trial = controller.loop.trial
    assert trial is not None, controller.loop.reason
    assert put_returned and put_returned[-1] > ticked_at
    assert trial.started_at == trial.began_at == put_returned[-1]
    # The hour's count keeps the tick's time: entered before the apply, it counts an
    # apply that raised too.
    assert controller.loop.trial_starts == [ticked_at] and pod.puts
