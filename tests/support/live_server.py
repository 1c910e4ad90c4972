"""A live slopilot server on 127.0.0.1 (a free port) in this process, for tests.

    with start_server(knobs={"max_waiting": 4}, admin_token="t") as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x")
        ...
        srv.call(lambda engine: engine.scheduler.kv.num_used_blocks)  # on the engine thread

The simulated executor (the default) runs in real time on the ``tiny-cpu`` scenario's
cost model; ``executor="torch"`` loads ``model`` (default ``tiny-random``) on the CPU.
uvicorn runs on its own thread with its own event loop; ``stop()`` drains and joins.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from slopilot.engine.clients import ClientClasses
from slopilot.engine.config import EngineConfig
from slopilot.engine.connection_cap import DEFAULT_CEILING
from slopilot.engine.engine import LLMEngine
from slopilot.engine.http_deadlines import DEFAULT_DEADLINES, CallLater, Deadlines
from slopilot.engine.server.admin_credential import AdminCredential
from slopilot.engine.server.async_engine import AsyncEngine
from slopilot.engine.server.backends import Backend, build_simulated, build_torch
from slopilot.engine.server.request_limits import DEFAULT_MAX_BODY_BYTES
from slopilot.engine.server.uvicorn_runner import DrainingServer, make_server, run_in_thread
from slopilot.engine.watched_file import WatchedFile
from tests.support.waits import HANG_GUARD_S

T = TypeVar("T")


@dataclass
class LiveServer:
    url: str
    server: DrainingServer
    thread: threading.Thread
    backend: Backend
    # The admin API's base URL: its own port when started with admin_port, else ``url``.
    admin_url: str = ""

    def __post_init__(self) -> None:
        self.admin_url = self.admin_url or self.url

    @property
    def engine(self) -> AsyncEngine:
        return self.server.state.engine

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self.server.loop is None:
            raise RuntimeError("the server is not running")
        return self.server.loop

    def call(self, fn: Callable[[LLMEngine], T]) -> T:
        """Run ``fn(engine)`` on the engine thread between iterations; its result."""
        fut = asyncio.run_coroutine_threadsafe(self.engine.call(fn), self.loop)
        # The engine takes it between two steps, however long a busy machine makes those:
        # only a hang is bounded.
        return fut.result(HANG_GUARD_S)

    def begin_drain(self) -> None:
        """What SIGTERM does: 503 from now on; running requests go on (then exit)."""
        self.server.handle_exit(15, None)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(HANG_GUARD_S)  # the drain is bounded by drain_timeout_s; a hang
        if self.thread.is_alive():
            raise RuntimeError(f"the server thread did not stop within the suite's hang "
                               f"guard ({HANG_GUARD_S:g} s)")

    def __enter__(self) -> LiveServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def build_backend(executor: str = "simulated", *, knobs: Mapping[str, Any] | None = None,
                  num_gpu_blocks: int | None = None, num_cpu_blocks: int | None = None,
                  model: str = "tiny-random", scenario: str = "tiny-cpu",
                  realtime: bool = True, served_model_name: str | None = None) -> Backend:
    config = EngineConfig().with_overrides(knobs or {})
    if executor == "simulated":
        return build_simulated(config, scenario=scenario, num_gpu_blocks=num_gpu_blocks,
                               realtime=realtime, served_model_name=served_model_name)
    if executor == "torch":
        return build_torch(config, model, num_gpu_blocks=num_gpu_blocks,
                           num_cpu_blocks=num_cpu_blocks, served_model_name=served_model_name)
    raise ValueError(f"executor={executor!r}: use 'simulated' or 'torch'")


def start_server(backend: Backend | None = None, *,
                 admin_token: str | AdminCredential | None = None,
                 drain_timeout_s: float = 5.0, log_level: str = "warning",
                 admin_port: int | None = None, check_integrity: bool = True,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 clients: WatchedFile[ClientClasses] | None = None,
                 deadlines: Deadlines = DEFAULT_DEADLINES,
                 call_later: CallLater | None = None,
                 max_connections: int = DEFAULT_CEILING,
                 **backend_args: Any) -> LiveServer:
    """Start a server (``backend`` or one built by ``build_backend(**backend_args)``).

    ``admin_port=0`` puts the admin API on a free port of its own (``admin_url``); tests
    check the KV bookkeeping whenever the engine goes idle (``check_integrity``);
    ``clients``: the grants file, as ``slopilot serve --clients`` watches it;
    ``call_later``: what times the ``deadlines`` (a test's ``ManualTimers``, fired on
    the server's loop), the loop's unless given.
    """
    backend = backend or build_backend(**backend_args)
    server = make_server(backend, port=0, admin_port=admin_port, admin_token=admin_token,
                         drain_timeout_s=drain_timeout_s, log_level=log_level,
                         check_integrity=check_integrity, max_body_bytes=max_body_bytes,
                         clients=clients, deadlines=deadlines, call_later=call_later,
                         max_connections=max_connections)
    thread = run_in_thread(server)
    admin = f"http://127.0.0.1:{server.admin_port}" if server.admin_port is not None else ""
    return LiveServer(f"http://127.0.0.1:{server.bound_port}", server, thread, backend, admin)

