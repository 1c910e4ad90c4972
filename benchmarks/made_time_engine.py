"""``slopilot serve`` that also keeps each token's made time, as vLLM measures latency.

vLLM's TTFT runs from its frontend's arrival stamp to its first engine output, and its
inter-token latency between the engine core's steps: times of the engine making the
tokens, not of the client getting them. The built-in engine's server observes both at
its writes instead (as its client sees them), so a stand-in for vLLM that must also say
what vLLM would have measured needs one more observer on the engine: this one, which
keeps every first token's TTFT (from the request's arrival stamp to the end of the step
that made it) and every later token's gap (between the steps that made a request's
tokens, ``LLMEngine._tokens``). ``meter_truth.py`` runs it as its stand-in and reads
them at ``http://127.0.0.1:MADE_PORT/`` as ``{"ttft": [...], "gaps": [...]}`` (seconds,
in the order made).

    python benchmarks/made_time_engine.py --made-port 9100 serve --executor simulated ...

The built-in engine stamps a request's arrival when its HTTP request came in, before it
is parsed and tokenized; vLLM's stamp is later, once parsed. The made TTFT here holds
that parsing (well under a millisecond for the simulator's placeholder tokenizer).
"""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from slopilot.engine.engine import LLMEngine
from slopilot.engine.outputs import SchedulerOutput
from slopilot.engine.request import Request


class MadeTimes:
    """A ``StepObserver``: each token's latency as its engine made it."""

    def __init__(self) -> None:
        self.ttft: list[float] = []
        self.gaps: list[float] = []

    def on_step(self, engine: LLMEngine, out: SchedulerOutput, elapsed_s: float,
                now: float) -> None:
        pass

    def on_first_token(self, req: Request, ttft_s: float, now: float) -> None:
        self.ttft.append(ttft_s)

    def on_token_gap(self, req: Request, gap_s: float, now: float) -> None:
        self.gaps.append(gap_s)

    def on_finished(self, req: Request, now: float) -> None:
        pass


def serve_made_times(made: MadeTimes, port: int) -> None:
    """``made``'s lists as JSON on 127.0.0.1:``port``, from a thread of its own."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            # Copies: the engine thread appends while this one encodes.
            body = json.dumps({"ttft": list(made.ttft), "gaps": list(made.gaps)}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] != "--made-port":
        print("usage: made_time_engine.py --made-port PORT serve [flags]", file=sys.stderr)
        return 2
    from slopilot import cli
    from slopilot.engine.server import backends

    made = MadeTimes()
    build = backends.build_simulated

    def build_observed(*args: Any, **kwargs: Any) -> backends.Backend:
        backend = build(*args, **kwargs)
        backend.engine.observers.append(made)
        return backend

    # ``serve`` looks the builder up when it runs: the simulated engine it builds then
    # carries the observer too.
    backends.build_simulated = build_observed
    serve_made_times(made, int(argv[1]))
    return cli.main(argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
