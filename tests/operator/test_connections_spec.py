"""``spec.connections``: how long the pods' server keeps a client's connection waiting
(``slopilot serve``'s deadline flags, the meter's in front of vLLM). Behind a mesh or an
ingress that keeps idle connections to the pods (Envoy: an hour), a server keep-alive
shorter than the proxy's loses the request the proxy sends as the server closes."""

from __future__ import annotations

from typing import Any

import pytest

from slopilot.operator.meter_container import meter_command
from slopilot.operator.render import render_all
from slopilot.operator.spec import SpecError, parse_spec
from tests.operator.test_crd_parity import admitted
from tests.operator.test_render import body


def _commands(**spec: Any) -> list[str]:
    b = body(**spec)
    out = render_all(b, parse_spec(b), admin_token_sha256="ab" * 32)
    containers = out.deployment["spec"]["template"]["spec"]["containers"]
    return [arg for c in containers for arg in c.get("command", []) + c.get("args", [])]


@pytest.mark.parametrize("backend", ["builtin", "vllm"])
def test_the_deadlines_given_reach_the_server_the_clients_connect_to(backend: str) -> None:
    given = _commands(backend=backend, connections={"keepAlive": "75s", "send": "0s",
                                                    "head": "10s", "bodyIdle": "1m"})
    flags = ["--keep-alive-timeout", "75", "--send-timeout", "0", "--head-timeout", "10",
             "--body-idle-timeout", "60"]
    for flag, value in zip(flags[::2], flags[1::2], strict=True):
        at = given.index(flag)
        assert given[at + 1] == value, (flag, given)
    server = "meter" if backend == "vllm" else "serve"
    assert given.index("--keep-alive-timeout") > given.index(server)
    # None given: the server's own defaults, no flag.
    assert not any(f in _commands(backend=backend) for f in flags[::2])


def test_the_meter_command_alone_carries_them_on_vllm() -> None:
    b = body(backend="vllm", connections={"keepAlive": "1h"})
    assert meter_command(parse_spec(b))[-2:] == ["--keep-alive-timeout", "3600"]


@pytest.mark.parametrize(("connections", "words"), [
    ({"keepAlive": "0s"}, "spec.connections.keepAlive='0s'"),
    ({"keepAlive": "2h"}, "spec.connections.keepAlive='2h'"),
    ({"head": "500ms"}, "spec.connections.head='500ms'"),
    ({"send": "soon"}, "spec.connections.send: 'soon' is not a duration"),
    ({"bodyIdle": "11m"}, "spec.connections.bodyIdle='11m'"),
    ({"maxConnections": 0}, "spec.connections.maxConnections=0: use 1 to 65536"),
    ({"maxConnections": -5}, "spec.connections.maxConnections=-5: use 1 to 65536"),
    ({"maxConnections": 10**7}, "spec.connections.maxConnections=10000000: use 1 to 65536"),
    ({"maxConnections": "lots"}, "spec.connections.maxConnections='lots': expected int"),
    ({"maxConnections": 2.5}, "spec.connections.maxConnections=2.5: expected int"),
])
def test_a_deadline_out_of_bounds_is_refused_by_both(connections: dict[str, str],
                                                     words: str) -> None:
    with pytest.raises(SpecError) as exc:
        parse_spec(body(connections=connections))
    assert any(words in p for p in exc.value.problems), exc.value.problems
    _, refused = admitted({"connections": connections})
    assert any("connections" in r for r in refused), refused


@pytest.mark.parametrize(("backend", "server"), [("builtin", "serve"), ("vllm", "meter")])
def test_the_connection_cap_given_reaches_the_server_the_clients_connect_to(
        backend: str, server: str) -> None:
    given = _commands(backend=backend, connections={"maxConnections": 2000})
    at = given.index("--max-connections")
    assert given[at + 1] == "2000" and at > given.index(server)
    assert "--max-connections" not in _commands(backend=backend)  # the server's default
