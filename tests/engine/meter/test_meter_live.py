"""The meter on real sockets, in front of an OpenAI-compatible engine (ours, simulated):
an openai client streams through it, and the meter's verdicts are the engine server's
own, which judges each stream as delivered too; what is not a stream it leaves alone."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import uvicorn

from slopilot.engine.meter.commands import uvicorn_config
from slopilot.engine.meter.proxy import Meter
from slopilot.engine.meter.slo_watch import SLOWatch
from slopilot.engine.request import Priority
from slopilot.engine.slo import SLOSpec
from slopilot.engine.verdicts import Verdicts
from tests.support.live_server import LiveServer, start_server
from tests.support.waits import HANG_GUARD_S, wait_for

# Generous: every request meets it on any machine, so the two counts must agree exactly.
SLO = {"classes": {"p0": {"ttftP99Ms": 60000, "tbtP99Ms": 60000}}}


@pytest.fixture
def engine() -> Iterator[LiveServer]:
    with start_server() as srv:
        srv.backend.metrics.set_slo(SLOSpec.from_dict(SLO))
        yield srv


@pytest.fixture
def meter(engine: LiveServer, tmp_path: Path) -> Iterator[tuple[str, Meter]]:
    slo_file = tmp_path / "slo.json"
    slo_file.write_text(json.dumps(SLO))
    app = Meter(engine.url, SLOWatch(slo_file, Verdicts()), Priority.P0)
    server = uvicorn.Server(uvicorn_config(app, host="127.0.0.1", port=0,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started or not thread.is_alive(), what="the meter to listen")
    assert server.started, "the meter did not start"
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        server.should_exit = True
        thread.join(HANG_GUARD_S)


def test_streams_through_the_meter_are_judged_as_the_engine_judges_them(
        engine: LiveServer, meter: tuple[str, Meter]) -> None:
    url, app = meter
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    name = engine.backend.served_model_name
    texts, chunks = [], 0
    for i in range(3):
        stream = client.completions.create(
            model=name, prompt=f"hello {i}", max_tokens=8 + i, stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True, "priority": "p0"})
        got = [c.choices[0].text for c in stream if c.choices]
        texts.append("".join(got))
        chunks += sum(1 for t in got if t)
    body = client.completions.create(model=name, prompt="plain", max_tokens=4,
                                     extra_body={"ignore_eos": True, "priority": "p0"})
    assert body.choices[0].text  # a body passes through, unjudged
    assert all(t.split() == ["tok"] * (8 + i) for i, t in enumerate(texts))
    label = SLOSpec.from_dict(SLO).p0.label
    own = {k: v for k, v in app.verdicts.counts().items() if v != (0, 0)}
    assert own == {(Priority.P0, label, True): (3, 8 + 9 + 10)}
    served = engine.backend.metrics
    wait_for(lambda: served.verdicts()[Priority.P0, label, True][0] == 4,
             what="the engine to judge the body too")
    assert served.verdicts()[Priority.P0, label, True] == (4, 8 + 9 + 10 + 4)
    assert app.model_name == name
    # One first token per stream and a gap per later chunk that brought tokens, as the
    # engine's server observes them at its writes (it observes the body's too, as made).
    assert (app.latency.ttft.count, app.latency.gaps.count) == (3, chunks - 3)
    metrics = httpx.get(url + "/metrics", timeout=HANG_GUARD_S).text
    # The engine's exposition, then the meter's verdicts (this engine judges too: a vLLM
    # exports none, so there the meter's are the only ones).
    engine_part, meter_part = metrics.rsplit("# HELP slopilot_slo_requests_total", 1)
    assert "vllm:num_requests_running" in engine_part
    assert f'{{met="true",model_name="{name}",priority_class="p0",slo="{label}"}} 3.0' \
        in meter_part


def test_a_chat_stream_through_the_meter_is_counted_by_its_usage_and_given_none(
        engine: LiveServer, meter: tuple[str, Meter]) -> None:
    """The meter asks the built-in server for each chunk's usage: its choices' tokens
    are counted by it however the server merged them into chunks (a gap per chunk after
    each choice's first), and the client, which asked for none, gets none."""
    url, app = meter
    body = {"model": engine.backend.served_model_name, "stream": True, "n": 2,
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6,
            "ignore_eos": True, "priority": "p0"}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body,
                      timeout=HANG_GUARD_S) as res:
        assert res.status_code == 200, res.read()
        raw = res.read()
    events = raw.split(b"\n\n")
    assert events[-2:] == [b"data: [DONE]", b""] and b'"usage"' not in raw
    texts, chunks = {0: "", 1: ""}, 0
    for event in events[:-2]:
        choice = json.loads(event.removeprefix(b"data: "))["choices"][0]
        texts[choice["index"]] += choice["delta"].get("content", "")
        chunks += bool(choice["delta"].get("content"))
    assert [t.split() for t in texts.values()] == [["tok"] * 6] * 2
    assert (app.latency.ttft.count, app.latency.gaps.count) == (2, chunks - 2)
