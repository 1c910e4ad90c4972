"""An https Prometheus is read only once its certificate checks out (tls.py).

Every number the control loop acts on comes from Prometheus: unverified, anyone on the
path could answer for it. Both readers, ``query_at`` (windows, workload, iterations) and
``AlertSource``, check the certificate the same way, and a refused one is the usual
``PrometheusUnavailable``, saying what failed and how to fix it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from slopilot.tuner.prometheus.alerts import AlertSource
from slopilot.tuner.prometheus.bounded import bounded_client
from slopilot.tuner.prometheus.profiling import WorkloadProfile
from slopilot.tuner.prometheus.query import query_at
from slopilot.tuner.prometheus.tls import TRUST_FIX, CAFileError, TLSVerify
from slopilot.tuner.study.evaluator import PrometheusUnavailable
from tests.support.tls import ThrowawayCA, https_prometheus, throwaway_ca


def read_alerts(url: str, verify: TLSVerify) -> list[object]:
    source = AlertSource(url, "chat", namespace="team", verify=verify)
    try:
        return list(source.firing())
    finally:
        source.close()


def read_query(url: str, verify: TLSVerify) -> list[object]:
    return list(query_at(url, verify=verify)("up", None))


READERS: dict[str, Callable[[str, TLSVerify], list[object]]] = {
    "alerts": read_alerts, "query": read_query}


@pytest.fixture
def ca(tmp_path: Path) -> ThrowawayCA:
    return throwaway_ca(tmp_path / "ca")


def test_a_certificate_no_trusted_ca_signed_is_refused_by_default(ca: ThrowawayCA) -> None:
    with https_prometheus(ca) as url, pytest.raises(PrometheusUnavailable) as info:
        query_at(url)("up", None)
    message = str(info.value)
    assert f"Prometheus at {url}: certificate verification failed" in message
    assert "SLOPILOT_PROMETHEUS_CA_FILE" in message and TRUST_FIX in message


@pytest.mark.parametrize("reader", sorted(READERS))
def test_every_reader_refuses_an_untrusted_certificate_and_says_why(
        ca: ThrowawayCA, reader: str) -> None:
    with https_prometheus(ca) as url, pytest.raises(PrometheusUnavailable) as info:
        READERS[reader](url, TLSVerify())
    # OpenSSL's verdict, not "cannot reach Prometheus ... check that it is running".
    assert "certificate verification failed (unable to get local issuer certificate)" \
        in str(info.value)
    assert "cannot reach" not in str(info.value)


@pytest.mark.parametrize("reader", sorted(READERS))
def test_a_server_the_trusted_ca_signed_is_read(ca: ThrowawayCA, reader: str) -> None:
    with https_prometheus(ca) as url:
        assert READERS[reader](url, TLSVerify(ca_file=str(ca.ca_file))) == []


@pytest.mark.parametrize("reader", sorted(READERS))
def test_a_ca_bundle_replaces_the_default_trust_and_trusts_only_its_own(
        ca: ThrowawayCA, tmp_path: Path, reader: str) -> None:
    other = throwaway_ca(tmp_path / "other")
    with https_prometheus(ca) as url, pytest.raises(PrometheusUnavailable,
                                                    match="certificate verification failed"):
        READERS[reader](url, TLSVerify(ca_file=str(other.ca_file)))


@pytest.mark.parametrize("reader", sorted(READERS))
def test_verification_turned_off_reads_any_certificate(ca: ThrowawayCA, reader: str) -> None:
    with https_prometheus(ca) as url:
        assert READERS[reader](url, TLSVerify(enabled=False)) == []


def test_the_workload_profile_reads_through_the_same_check(ca: ThrowawayCA) -> None:
    with https_prometheus(ca) as url, pytest.raises(PrometheusUnavailable,
                                                    match="certificate verification failed"):
        WorkloadProfile.from_prometheus(url, {"slopilot_deployment": "chat"}, 60)


def test_a_ca_to_trust_with_verification_off_is_a_contradiction() -> None:
    with pytest.raises(ValueError, match="keep one or the other"):
        TLSVerify(enabled=False, ca_file="/etc/ca.pem")


@pytest.mark.parametrize(("content", "needle"), [
    (None, "No such file"), (b"", "holds no PEM certificate"),
    (b"not a certificate\n", "holds no PEM certificate")])
def test_an_unusable_ca_bundle_says_why(tmp_path: Path, content: bytes | None,
                                        needle: str) -> None:
    path = tmp_path / "ca.pem"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(CAFileError, match=needle) as info:
        bounded_client(5.0, verify=TLSVerify(ca_file=str(path)))
    assert repr(str(path)) in str(info.value)
