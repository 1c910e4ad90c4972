"""``slopilot meter`` judges a stream from when its request's bytes reached the meter's
kernel: a meter whose loop was held up while a new connection waited in the accept
queue, its request with it, judges the wait as the client paid it (``http_arrival``'s
``backdate``, on the meter's real clock). Held past the objective's 500 ms, the stream's
first token missed it, however fast the engine answered once the meter read it.

Live sockets; the waits are on what the kernel reports (``tests.support.held_loop``).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from slopilot.engine.request import Priority
from tests.engine.meter.test_meter_http import LABEL, _completion, _serve, counted
from tests.support.held_loop import HAS_TCP_INFO, TICK_S, streamed_after_a_hold
from tests.support.waits import wait_for

TTFT_OBJECTIVE_MS = 500  # test_meter's SLO for p0
HELD_MS = TTFT_OBJECTIVE_MS + 2 * int(TICK_S * 1000) + 50

pytestmark = pytest.mark.skipif(not HAS_TCP_INFO, reason="TCP_INFO is Linux's")


def test_a_stream_held_in_the_accept_queue_past_its_objective_missed_it(
        tmp_path: Path) -> None:
    with _serve(tmp_path, clock=time.monotonic) as served:
        served.upstream.release[0].set()  # the engine answers at once
        streamed_after_a_hold(served.server.servers[0].get_loop(), served.port,
                              _completion(), HELD_MS)
        wait_for(lambda: counted(served.app) != {}, what="the stream judged")
        assert counted(served.app) == {(Priority.P0, LABEL, False): (1, 1)}
