"""Run the app under uvicorn: in the foreground with a draining signal handler, or on a
background thread (tests, the demo, anything that hosts several replicas in one process).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from types import FrameType

import uvicorn

from slopilot.engine.server.app import ServerState, create_app
from slopilot.engine.server.backends import Backend


class DrainingServer(uvicorn.Server):
    """A uvicorn server whose first SIGTERM/SIGINT drains before it exits.

    Draining: /health answers 503 and new requests 503, while running requests finish
    (up to the app's drain timeout); then uvicorn shuts down as usual. A second signal
    is uvicorn's own handling (exit now; a further Ctrl-C forces it).
    """

    def __init__(self, config: uvicorn.Config, state: ServerState) -> None:
        super().__init__(config)
        self.state = state
        self.loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task[None] | None = None
        self.bound_port: int | None = None
        self.ready = threading.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        await super().startup(sockets)
        if self.started:
            for server in self.servers:
                for sock in server.sockets:
                    self.bound_port = sock.getsockname()[1]
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
                admin_token: str | None = None, drain_timeout_s: float = 30.0,
                log_level: str = "warning", check_integrity: bool = True) -> DrainingServer:
    app = create_app(backend, admin_token=admin_token, drain_timeout_s=drain_timeout_s,
                     check_integrity=check_integrity)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                            timeout_graceful_shutdown=int(drain_timeout_s) + 5, access_log=False)
    return DrainingServer(config, app.state.slopilot)


def serve_forever(backend: Backend, *, host: str, port: int, admin_token: str | None,
                  drain_timeout_s: float, log_level: str) -> int:
    """Foreground ``slopilot serve``: prints one line with the URL once it listens."""
    server = make_server(backend, host=host, port=port, admin_token=admin_token,
                         drain_timeout_s=drain_timeout_s, log_level=log_level)

    def announce() -> None:
        if server.ready.wait() and server.bound_port is not None:
            print(f"slopilot serve: ready at http://{host}:{server.bound_port} "
                  f"(model {backend.served_model_name})", flush=True)

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

