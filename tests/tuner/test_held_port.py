"""A child server's port is its own from before it starts until it is done with it.

A port found free and let go was anyone's until the child bound it: under pytest's
workers a server another worker started could take it while a replica's Python started
or while a stopped Prometheus was down, and the child then exited "address already in
use" (``test_prometheus_down_holds_the_config_then_resumes`` restarts Prometheus on the
same port). Each test here takes the port on purpose in that gap, as that other server
would have, and the child must start there all the same.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from slopilot.tuner.local.deployment import LocalDeployment
from slopilot.tuner.local.held_port import HeldPort
from slopilot.tuner.local.prometheus_server import LocalPrometheus
from tests.support.fixtures import prometheus_binaries  # noqa: F401 - a fixture
from tests.support.ports import take_port
from tests.support.waits import HANG_GUARD_S


def test_a_held_port_is_refused_to_other_sockets_until_released() -> None:
    with HeldPort() as held:
        assert held.held and take_port(held.port) is None
        # What the child does: SO_REUSEADDR, as bind_socket and Go's listeners set it.
        child = socket.socket()
        child.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        with child:
            child.bind(("127.0.0.1", held.port))
            child.listen()
        # A port-0 bind never lands on it (a bound bucket is skipped), nor does a second
        # HeldPort, however many are made.
        others = [HeldPort() for _ in range(64)]
        assert held.port not in {o.port for o in others}
        for o in others:
            o.release()
    assert not held.held
    again = take_port(held.port)  # released: anyone's again
    assert again is not None
    again.close()


@pytest.mark.prometheus
@pytest.mark.usefixtures("prometheus_binaries")
def test_prometheus_starts_and_restarts_on_its_port_though_another_server_wants_it(
        tmp_path: Path) -> None:
    targets = tmp_path / "targets.json"
    targets.write_text("[]")
    prom = LocalPrometheus(tmp_path / "prometheus", targets, ready_timeout_s=HANG_GUARD_S)
    port = prom.port
    for _ in range(2):  # before its first start, then while it is down
        intruder = take_port(port)
        try:
            prom.start()
        finally:
            if intruder is not None:
                intruder.close()
            prom.stop()
        assert intruder is None and prom.port == port
    prom.close()  # for good: the port is let go
    assert not prom._held.held


class _Contested(LocalDeployment):
    """Each replica's port taken by another server while the replica is starting."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.intruders: list[socket.socket | None] = []

    def _command(self, port: int) -> list[str]:
        self.intruders.append(take_port(port))
        return super()._command(port)


def test_a_replica_starts_on_its_port_though_another_server_wants_it(tmp_path: Path) -> None:
    dep = _Contested("t", tmp_path, replicas=1, max_replicas=2, ready_timeout_s=HANG_GUARD_S)
    try:
        with dep:
            assert dep.replicas() == 1
            dep.scale(2)
            assert dep.replicas() == 2
    finally:
        for sock in dep.intruders:
            if sock is not None:
                sock.close()
    assert dep.intruders == [None, None]
