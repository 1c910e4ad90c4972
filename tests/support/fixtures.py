"""pytest fixtures around the real Prometheus and Alertmanager binaries (see
tests/support/prometheus.py and tests/support/alertmanager.py).

Where a binary is missing the tests skip, unless SLOPILOT_REQUIRE_PROMETHEUS (or
SLOPILOT_REQUIRE_ALERTMANAGER) is set (``make test`` sets both), where a missing binary is
a failure: a green run must not hide a skipped alerting test. Import the fixtures into a
test module to use them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

from tests.support.alertmanager import (
    AlertmanagerBinaries,
    AlertmanagerServer,
    start_alertmanager,
)
from tests.support.alertmanager import find_binaries as find_alertmanager_binaries
from tests.support.prometheus import (
    PrometheusBinaries,
    PrometheusServer,
    find_binaries,
    start_prometheus,
)

REQUIRE_ENV = "SLOPILOT_REQUIRE_PROMETHEUS"
REQUIRE_ALERTMANAGER_ENV = "SLOPILOT_REQUIRE_ALERTMANAGER"


def missing(reason: str, require_env: str) -> NoReturn:
    """A tool the tests need is missing: skip, or fail where ``require_env`` is set (a
    green run must not hide the tests that need it)."""
    if os.environ.get(require_env):
        pytest.fail(f"{reason}; {require_env} is set, so this is a failure")
    pytest.skip(f"{reason}; set {require_env}=1 to fail instead of skipping")


@pytest.fixture(scope="session")
def prometheus_binaries() -> PrometheusBinaries:
    found = find_binaries()
    if found is None:
        missing("the prometheus and promtool binaries are not on PATH (install them: "
                "apt-get install -y prometheus)", REQUIRE_ENV)
    return found


@pytest.fixture
def prometheus_factory(prometheus_binaries: PrometheusBinaries, tmp_path: Path
                       ) -> Iterator[Callable[..., PrometheusServer]]:
    """``start(**kwargs)`` starts a server (see ``start_prometheus``); all stop at teardown."""
    servers: list[PrometheusServer] = []

    def start(**kwargs: Any) -> PrometheusServer:
        server = start_prometheus(prometheus_binaries, tmp_path / f"prom{len(servers)}",
                                  **kwargs)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(scope="session")
def prometheus_server(prometheus_binaries: PrometheusBinaries,
                      tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    """One bare server (no targets, no rules) shared by tests that only send queries."""
    server = start_prometheus(prometheus_binaries, tmp_path_factory.mktemp("prometheus"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def alertmanager_binaries() -> AlertmanagerBinaries:
    found = find_alertmanager_binaries()
    if found is None:
        missing("the alertmanager (Debian: prometheus-alertmanager) and amtool binaries "
                "are not on PATH (install them: apt-get install -y prometheus-alertmanager, "
                "or make alertmanager)", REQUIRE_ALERTMANAGER_ENV)
    return found


@pytest.fixture
def alertmanager_factory(alertmanager_binaries: AlertmanagerBinaries, tmp_path: Path
                         ) -> Iterator[Callable[[dict[str, Any]], AlertmanagerServer]]:
    """``start(config)`` starts a server with that ``alertmanager.yml`` (see
    ``start_alertmanager``); all stop at teardown."""
    servers: list[AlertmanagerServer] = []

    def start(config: dict[str, Any]) -> AlertmanagerServer:
        server = start_alertmanager(alertmanager_binaries, tmp_path / f"am{len(servers)}",
                                    config)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()
