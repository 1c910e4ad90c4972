"""``slopilot serve`` counts a streamed token delivered only within a bounded distance of
its client: a client that stops reading is cut by the send deadline, as the kernel's
default buffers would otherwise hide it.

Unlike ``test_send_deadline``, the server's send buffer is left as Linux sizes it (on
loopback it takes megabytes); only the client's receive buffer is small, as a slow or
stalled reader's window is. Before, uvicorn's send returned once the kernel took a chunk,
so a whole answer of a few hundred KB counted as delivered, its gaps as the engine made
them, and the request as met with finish reason ``length``, while its client had none of
it; the transport never paused, so the send deadline was never armed and the engine
generated for nobody.

The deadline is timed on ``ManualTimers``; the waits end on conditions (a paused
transport, a request observed), never on a measured time.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from slopilot.engine.http_deadlines import Deadlines
from slopilot.engine.request import Priority, RequestStatus
from slopilot.engine.slo import SLOSpec
from tests.support.live_server import LiveServer, start_server
from tests.support.manual_timers import ManualTimers
from tests.support.stalled_client import EngineFreeze, paused, stalled_stream
from tests.support.tcp_queues import cut_at_send_deadline, settle_send_deadline
from tests.support.waits import wait_for

SEND_S = 60.0
MAX_TOKENS = 3000  # some 300 KB with top-5 logprobs: within what the kernel took before
SMALL_BUFFER = 4096  # the client's receive buffer (the kernel doubles it)


@pytest.fixture(scope="module")
def srv() -> Iterator[tuple[LiveServer, ManualTimers]]:
    timers = ManualTimers()
    with start_server(deadlines=Deadlines(send_s=SEND_S), call_later=timers.call_later) as server:
        server.backend.metrics.set_slo(SLOSpec.from_dict({"profile": "relaxed"}))
        yield server, timers








def test_a_stalled_reader_is_cut_by_the_send_deadline_not_counted_served(
        srv: tuple[LiveServer, ManualTimers]) -> None:
    server, timers = srv
    metrics = server.backend.metrics
    e2e = metrics._e2e[Priority.P1].count
    aborts, timeouts = metrics._success["abort"], metrics.send_timeouts
    with stalled_stream(server, MAX_TOKENS, SMALL_BUFFER):
        # The answer's writing pauses (what the kernel holds unsent is bounded), or,
        # before, the whole answer went into the kernel and the request was observed.
        wait_for(lambda: paused(server) or metrics._e2e[Priority.P1].count > e2e,
                 what="the server's writing to pause, or the request to be observed")
        assert paused(server), "the whole answer counted as delivered to a stalled reader"
        assert metrics._e2e[Priority.P1].count == e2e
        freeze = EngineFreeze(server)
        held = freeze.hold()
        assert [r.num_output_tokens < MAX_TOKENS for r in held] == [True]
        # The client's kernel may take what its buffer holds after the pause: progress.
        conn = next(iter(server.server.server_state.connections))
        settle_send_deadline(conn, timers, SEND_S)
        cut_at_send_deadline(conn, timers)
        wait_for(lambda: metrics._e2e[Priority.P1].count == e2e + 1, what="the request observed")
        freeze.thaw()
        assert (metrics._success["abort"], metrics.send_timeouts) == (aborts + 1, timeouts + 1)
        # Cut by the abort, its KV blocks freed, long before its tokens ran out.
        wait_for(lambda: server.engine.num_active == 0, what="no request left running")
        assert server.call(lambda e: e.scheduler.kv.num_used_blocks) == 0
        assert held[0].status is RequestStatus.FINISHED_ABORTED
        assert held[0].num_output_tokens < MAX_TOKENS
        # Counted delivered: what went out before the pause, a bounded few dozen.
        # Not judged met: a stream cut short is judged only where it had missed already.
        assert [k for k, (n, _) in metrics._verdicts.counts().items() if n and k[2]] == []
