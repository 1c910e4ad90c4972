"""A test's Prometheus or Alertmanager binds the port it was given, whoever else starts.

``start_ready`` found a port free, let it go and started the binary on it: a server
another pytest worker started meanwhile could take it, and a try was lost (three, and
the test failed); where that server answered ``/-/ready`` first, the test was handed the
other worker's server. The test takes the port in that gap on purpose.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.support.fixtures import prometheus_binaries  # noqa: F401 - a fixture
from tests.support.local_server import start_ready
from tests.support.ports import take_port
from tests.support.prometheus import PrometheusBinaries, PrometheusServer, write_config


@pytest.mark.prometheus
def test_a_server_starts_on_the_first_port_it_was_given_though_another_wants_it(
        tmp_path: Path, prometheus_binaries: PrometheusBinaries) -> None:  # noqa: F811
    config = tmp_path / "prometheus.yml"
    write_config(config, targets=[], rule_files=[], scrape_interval_s=1,
                 evaluation_interval_s=1)
    given: list[int] = []
    intruders: list[socket.socket] = []

    def argv(port: int) -> list[str]:
        given.append(port)
        if (sock := take_port(port)) is not None:
            intruders.append(sock)
        return [str(prometheus_binaries.prometheus), f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]

    try:
        server = start_ready(PrometheusServer, "Prometheus", argv, tmp_path, attempts=3)
        try:
            assert server.query("up")["status"] == "success"
        finally:
            server.stop()
    finally:
        for sock in intruders:
            sock.close()
    assert given == [server.port] and intruders == []
    # Let go at stop(): a check that a plain bind takes it again would race the
    # connections' TIME_WAIT, which holds it from such a bind for a minute.
    assert server.held is not None and not server.held.held
