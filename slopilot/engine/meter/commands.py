"""``slopilot meter``: the proxy the operator runs beside each vLLM engine (meter/)."""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slopilot.engine.deadline_flags import (
    add_deadline_flags,
    add_max_connections_flag,
    deadlines_from_flags,
    max_connections_from_flag,
    mib,
)
from slopilot.engine.meter.body_budget import BODY_BUDGET_MIB, MAX_BODY_MIB, map_large_blocks
from slopilot.engine.meter.model_context import DEFAULT_MAX_MODEL_LEN, MAX_CONTEXT
from slopilot.engine.port_flag import port
from slopilot.engine.request import Priority

if TYPE_CHECKING:
    import socket

    import uvicorn

    from slopilot.engine.http_deadlines import CallLater, Deadlines
    from slopilot.engine.meter.proxy import Meter


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "meter", help="proxy an OpenAI-compatible engine (vLLM) and judge each stream "
        "against the SLO as its client sees it",
        description="Forward every request to --upstream and serve its answers back; "
        "judge each streamed completion (TTFT and token gaps as written to the client) "
        "against --priority-class's objectives in --slo-file, count each request for "
        "generation as it arrives, and serve the upstream's /metrics with the verdict "
        "counters, the client-side TTFT and TBT histograms and the arrivals after them.")
    p.add_argument("--upstream", required=True, help="the engine's URL, e.g. "
                   "http://127.0.0.1:8001")
    # Every interface, where serve listens on 127.0.0.1: in its pod the meter is what
    # vLLM's clients reach, on the pod's address, and the operator passes no --host.
    p.add_argument("--host", default="0.0.0.0",
                   help="the address to listen on (default 0.0.0.0: every interface, as "
                   "in the vLLM pod the operator runs it in, where clients reach it on the "
                   "pod's address; --host 127.0.0.1 for this machine only)")
    p.add_argument("--port", type=port("--port"), default=8000)
    p.add_argument("--slo-file", type=Path, required=True,
                   help="the SLO (spec.slo's JSON), read again whenever it changes")
    p.add_argument("--priority-class", default="p0", choices=[q.label for q in Priority],
                   help="the class every request is judged in (spec.slo.vllmClass)")
    p.add_argument("--max-body-mb", type=mib("--max-body-mb", MAX_BODY_MIB), default=None,
                   metavar="MIB", help=f"largest request body accepted, in MiB (default "
                   f"{MAX_BODY_MIB}); a larger one is answered 413, before it is read where "
                   "its Content-Length says so")
    p.add_argument("--body-budget-mb", type=mib("--body-budget-mb", BODY_BUDGET_MIB),
                   default=None, metavar="MIB", help="request bodies held at once, in MiB "
                   f"(default {BODY_BUDGET_MIB}; at least --max-body-mb): a body waits, "
                   "unread, for room, and is let go once sent on. With the interpreter's "
                   "65 MiB and the streams', within the meter's memory limit")
    p.add_argument("--max-model-len", type=_context, default=None, metavar="TOKENS",
                   help="the model's context, as vLLM's --max-model-len: the bound on a "
                   "body's JSON values for generation. Default: learned from the engine's "
                   "/v1/models, which a vLLM run with --api-key refuses the meter (it then "
                   f"keeps {DEFAULT_MAX_MODEL_LEN:,} tokens); given, the meter does not ask")
    add_deadline_flags(p)
    add_max_connections_flag(p, "a quarter of ulimit -n, at most 1024: each connection "
                             "takes two descriptors, its client's and vLLM's")
    p.add_argument("--log-level", choices=("critical", "error", "warning", "info", "debug"),
                   default="info")
    p.set_defaults(func=run)


def _context(text: str) -> int:
    """argparse type of ``--max-model-len``: tokens, a whole number within
    ``MAX_CONTEXT``."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_CONTEXT:
        raise argparse.ArgumentTypeError(
            f"--max-model-len {text}: expected the model's context in tokens, a whole "
            f"number from 1 to {MAX_CONTEXT:,}, e.g. 8192 (vLLM's --max-model-len)")
    return value


def run(args: argparse.Namespace) -> int:
    import logging
    import sys

    import httpx

    from slopilot.engine.alert_factors import AlertFactorsError, alert_factors_from_env
    from slopilot.engine.listen_socket import ListenError, bind_listen
    from slopilot.engine.meter.proxy import Meter
    from slopilot.engine.meter.slo_watch import SLOWatch
    from slopilot.engine.slo import SLOError
    from slopilot.engine.verdicts import Verdicts

    try:
        upstream = httpx.URL(args.upstream)
    except httpx.InvalidURL:
        upstream = None
    # A path would be replaced by each request's: the engine is served from its root.
    if upstream is None or upstream.scheme not in ("http", "https") or not upstream.host \
            or upstream.path not in ("", "/") or upstream.query:
        print(f"slopilot meter: --upstream {args.upstream!r}: expected the engine's "
              "scheme, host and port, e.g. http://127.0.0.1:8001", file=sys.stderr)
        return 2
    try:
        deadlines = deadlines_from_flags(args)
        max_connections = max_connections_from_flag(args.max_connections, 2)
    except ValueError as exc:
        print(f"slopilot meter: {exc}", file=sys.stderr)
        return 2
    max_body = MAX_BODY_MIB << 20 if args.max_body_mb is None else args.max_body_mb
    budget = BODY_BUDGET_MIB << 20 if args.body_budget_mb is None else args.body_budget_mb
    if budget < max_body:
        print(f"slopilot meter: --body-budget-mb {budget / 2**20:g}: below --max-body-mb "
              f"{max_body / 2**20:g}; set it to {max_body / 2**20:g} or more (a body of the "
              "cap would wait for room for ever)", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(message)s")
    try:
        slo = SLOWatch(args.slo_file, Verdicts())
    except SLOError as exc:
        print(f"slopilot meter: --slo-file {exc}", file=sys.stderr)
        return 2
    try:
        factors = alert_factors_from_env()
    except AlertFactorsError as exc:
        print(f"slopilot meter: {exc}", file=sys.stderr)
        return 2
    try:  # here, not in uvicorn: its failed bind was an ERROR line naming no flag
        listen = bind_listen(args.host, args.port, "--port")
    except ListenError as exc:
        print(f"slopilot meter: {exc}", file=sys.stderr)
        return 2
    app = Meter(args.upstream, slo, Priority.parse(args.priority_class),
                max_body_bytes=max_body, body_budget_bytes=budget,
                max_model_len=args.max_model_len, alert_factors=factors)
    map_large_blocks()  # a body freed is memory given back (process-wide, so here)
    server = _announcing(args.upstream)(uvicorn_config(
        app, host=args.host, port=args.port, log_level=args.log_level, deadlines=deadlines,
        max_connections=max_connections))
    logging.getLogger("slopilot.meter").info(
        "at most %d connections held for clients (--max-connections); past it a request is "
        "answered 503", max_connections)
    # uvicorn re-raises the Ctrl-C it shut down on; uvicorn.run, used before, hid it.
    with listen, contextlib.suppress(KeyboardInterrupt):
        server.run(sockets=[listen])
    return 0 if server.started else 1


def _announcing(upstream: str) -> type[uvicorn.Server]:
    """A uvicorn server that logs where it listens once it does."""
    import uvicorn

    class Announcing(uvicorn.Server):
        """uvicorn says where it listens only when it binds the socket itself; given the
        meter's (listen_socket.py), it said nothing."""

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            import logging

            await super().startup(sockets)
            if self.started and sockets:
                host, port = sockets[0].getsockname()[:2]
                logging.getLogger("slopilot.meter").info(
                    "listening at http://%s:%d, forwarding to %s",
                    f"[{host}]" if ":" in host else host, port, upstream)

    return Announcing


def uvicorn_config(app: Meter, *, host: str, port: int, log_level: str,
                   deadlines: Deadlines | None = None,
                   call_later: CallLater | None = None,
                   max_connections: int | None = None) -> uvicorn.Config:
    """How ``slopilot meter`` serves ``app`` (tests serve it the same way);
    ``deadlines``: what a client may make a connection wait for (http_deadlines'
    defaults unless given; ``slopilot serve``'s flags), timed on ``call_later`` (the
    loop's unless given: a test's own clock); past ``max_connections`` (the default
    ceiling unless given) a request is refused 503 and a probe's or scrape's answered,
    counted in ``app.connection_cap`` (connection_cap.py), and one for generation in the
    meter's class too (``Meter.count_cap_refusal``)."""
    import uvicorn

    from slopilot.engine.connection_cap import (
        DEFAULT_CEILING,
        CapGate,
        ConnectionCap,
        with_connection_cap,
    )
    from slopilot.engine.http_arrival import httptools_protocol
    from slopilot.engine.http_deadlines import DEFAULT_DEADLINES, with_deadlines
    from slopilot.engine.http_head_limit import bounded_head
    from slopilot.engine.tcp_received import counts_real_time

    # httptools: the meter's CPU a chunk is the ceiling of what one pod can stream
    # through it (a quarter less than with h11); its requests stamped on arrival on the
    # meter's clock: when their bytes reached the kernel (tcp_received) where that clock
    # counts real time. No date or server of uvicorn's: the engine's pass through, and
    # would be there twice (the meter dates its own answers). A client that stalls is let
    # go (http_deadlines): each connection holds a file descriptor of the pod's.
    cap = ConnectionCap(max_connections or DEFAULT_CEILING)
    app.count_connections(cap)
    stamping = httptools_protocol(app.clock, backdate=counts_real_time(app.clock))
    http = with_connection_cap(with_deadlines(bounded_head(stamping),
                                              deadlines or DEFAULT_DEADLINES, call_later), cap)
    return uvicorn.Config(CapGate(app, cap, app.count_cap_refusal), host=host, port=port,
                          log_level=log_level,
                          access_log=False, lifespan="on", http=http,
                          server_header=False, date_header=False)
