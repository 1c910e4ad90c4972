"""Run the app under uvicorn: in the foreground with a draining signal handler, or on a
background thread (tests, the demo, anything that hosts several replicas in one process).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from types import FrameType

import uvicorn
from prometheus_client import ProcessCollector

from slopilot.engine.clients import ClientClasses
from slopilot.engine.connection_cap import (
    DEFAULT_CEILING,
    CapGate,
    ConnectionCap,
    with_connection_cap,
)
from slopilot.engine.engine import WallClock
from slopilot.engine.http_arrival import h11_protocol
from slopilot.engine.http_deadlines import (
    DEFAULT_DEADLINES,
    CallLater,
    Deadlines,
    with_deadlines,
)
from slopilot.engine.listen_socket import bind_listen
from slopilot.engine.server.admin_credential import AdminCredential
from slopilot.engine.server.app import ServerState, create_app
from slopilot.engine.server.backends import Backend
from slopilot.engine.server.cap_refusals import cap_refusal_counter
from slopilot.engine.server.gc_pauses import GCPauses
from slopilot.engine.server.request_limits import DEFAULT_MAX_BODY_BYTES
from slopilot.engine.server.startup_heap import freeze_startup_heap
from slopilot.engine.tcp_received import counts_real_time
from slopilot.engine.watched_file import WatchedFile


class DrainingServer(uvicorn.Server):
    """A uvicorn server whose first SIGTERM/SIGINT drains before it exits.

    Draining: /health answers 503 and new requests 503, while running requests finish
    (up to the app's drain timeout); then uvicorn shuts down as usual. A second signal
    is uvicorn's own handling (exit now; a further Ctrl-C forces it). It listens on the
    sockets it was given: the inference port, and the admin port when there is one.
    """

    def __init__(self, config: uvicorn.Config, state: ServerState,
                 listen: list[socket.socket], admin_port: int | None = None,
                 connection_cap: ConnectionCap | None = None) -> None:
        super().__init__(config)
        self.state = state
        self.connection_cap = connection_cap or ConnectionCap(DEFAULT_CEILING)
        """The slots of ``--max-connections`` (the listening port's and the admin's)."""
        self.listen = listen
        self.loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task[None] | None = None
        self.bound_port: int = listen[0].getsockname()[1]
        self.admin_port = admin_port
        self.ready = threading.Event()

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        await super().serve(sockets if sockets is not None else self.listen)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        await super().startup(sockets)
        if self.started:
            self.ready.set()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._drain_task is not None or self.loop is None or self.should_exit:
            super().handle_exit(sig, frame)
            return
        self.state.engine.draining = True
        self.loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        self._drain_task = asyncio.ensure_future(self._drain_then_exit())

    async def _drain_then_exit(self) -> None:
        await self.state.engine.drain(self.state.drain_timeout_s)
        self.should_exit = True


def make_server(backend: Backend, *, host: str = "127.0.0.1", port: int = 0,
                admin_port: int | None = None,
                admin_token: str | AdminCredential | None = None,
                drain_timeout_s: float = 30.0, log_level: str = "warning",
                check_integrity: bool = False,
                max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                clients: WatchedFile[ClientClasses] | None = None,
                deadlines: Deadlines = DEFAULT_DEADLINES,
                call_later: CallLater | None = None,
                max_connections: int = DEFAULT_CEILING) -> DrainingServer:
    """A server bound to ``port`` (and ``admin_port``: the admin API alone, when given;
    0 picks free ports). Binding happens here, so a taken port fails at once.
    ``deadlines``: how long a request's head, a silence in its body, and a client taking
    nothing of its answer may take (timed on ``call_later``, the loop's unless a test's);
    each connection the send deadline drops is counted (``slopilot_send_timeouts_total``);
    past ``max_connections`` a request is refused 503, a probe's or a scrape's answered
    (connection_cap.py)."""
    if admin_port is not None and admin_port == port != 0:
        raise ValueError(f"--admin-port {admin_port} is --port too; give the admin API a "
                         "port of its own")
    listen = [bind_listen(host, port, "--port")]
    bound_admin: int | None = None
    if admin_port is not None:
        try:
            listen.append(bind_listen(host, admin_port, "--admin-port"))
        except OSError:
            listen[0].close()
            raise
        bound_admin = listen[1].getsockname()[1]
    app = create_app(backend, admin_token=admin_token, drain_timeout_s=drain_timeout_s,
                     check_integrity=check_integrity, admin_port=bound_admin,
                     max_body_bytes=max_body_bytes, clients=clients)
    cap = ConnectionCap(max_connections, frozenset(
        {bound_admin} if bound_admin is not None else set()))
    backend.metrics.registry.register(cap)
    # Requests stamped when their bytes reached the kernel (tcp_received), on the engine's
    # clock when it counts real time; a test's own clock keeps the read's stamp.
    clock = backend.engine.clock
    stamping = h11_protocol(clock.now, backdate=isinstance(clock, WallClock)
                            and counts_real_time(clock.source))
    http = with_connection_cap(with_deadlines(stamping, deadlines, call_later,
                                              backend.metrics.count_send_timeout), cap)
    # A request for generation refused at the cap is counted in its class, as a 429.
    gate = CapGate(app, cap, cap_refusal_counter(backend.metrics, app.state.clients))
    config = uvicorn.Config(gate, host=host, port=port, log_level=log_level,
                            http=http, timeout_graceful_shutdown=int(drain_timeout_s) + 5,
                            access_log=False)
    return DrainingServer(config, app.state, listen, bound_admin, cap)


def serve_forever(backend: Backend, *, host: str, port: int, admin_port: int | None,
                  admin_token: str | AdminCredential | None, drain_timeout_s: float,
                  log_level: str,
                  check_integrity: bool = False,
                  max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                  clients: WatchedFile[ClientClasses] | None = None,
                  deadlines: Deadlines = DEFAULT_DEADLINES,
                  max_connections: int = DEFAULT_CEILING) -> int:
    """Foreground ``slopilot serve``: prints one line with the URLs once it listens."""
    server = make_server(backend, host=host, port=port, admin_port=admin_port,
                         admin_token=admin_token, drain_timeout_s=drain_timeout_s,
                         log_level=log_level, check_integrity=check_integrity,
                         max_body_bytes=max_body_bytes, clients=clients,
                         deadlines=deadlines, max_connections=max_connections)

    def announce() -> None:
        if server.ready.wait():
            admin = (f"; admin API at http://{host}:{server.admin_port}"
                     if server.admin_port is not None else "")
            print(f"slopilot serve: ready at http://{host}:{server.bound_port} "
                  f"(model {backend.served_model_name}){admin}", flush=True)

    heap = freeze_startup_heap()
    logging.getLogger("slopilot.serve").info(
        "froze the start-up heap: %d objects out of the garbage collector's reach (a full "
        "collection took %.0f ms)", heap.objects, heap.collect_ms)
    GCPauses().install(backend.metrics.registry)  # what collections cost from here on
    # process_start_time_seconds and the rest, as vLLM's default registry exports them:
    # the trial windows tell a restart in place by its start (prometheus/adapters.py).
    ProcessCollector(registry=backend.metrics.registry)
    logging.getLogger("slopilot.serve").info(
        "at most %d connections held for clients (--max-connections); past it a request is "
        "answered 503", max_connections)
    threading.Thread(target=announce, daemon=True).start()
    server.run()
    return 0 if server.started else 1


def run_in_thread(server: DrainingServer, *, timeout_s: float = 60.0) -> threading.Thread:
    """Start ``server`` on a daemon thread; returns once it listens (or raises)."""
    thread = threading.Thread(target=server.run, name="slopilot-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.ready.wait(0.05):
        if not thread.is_alive():
            raise RuntimeError("the server failed to start; see the log above")
        if time.monotonic() > deadline:
            server.should_exit = True
            thread.join(timeout=10)
            raise RuntimeError(f"the server did not start within {timeout_s} s")
    return thread
