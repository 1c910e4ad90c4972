"""An https Prometheus is read only once its certificate checks out (tls.py).

Every number the control loop acts on comes from Prometheus: unverified, anyone on the
path could answer for it. Both readers, ``query_at`` (windows, workload, iterations) and
``AlertSource``, check the certificate the same way, and a refused one is the usual
``PrometheusUnavailable``, saying what failed and how to fix it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from slopilot.tuner.prometheus.alerts import AlertSource
from slopilot.tuner.prometheus.bounded import bounded_client
from slopilot.tuner.prometheus.profiling import WorkloadProfile
from slopilot.tuner.prometheus.query import query_at
from slopilot.tuner.prometheus.tls import TRUST_FIX, CAFileError, TLSVerify
from slopilot.tuner.study.evaluator import PrometheusUnavailable
from tests.support.tls import (
    ThrowawayCA,
    https_prometheus,
    rewrite_in_place,
    swap_in,
    throwaway_ca,
)


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


ROTATIONS: dict[str, Callable[[Path, bytes], None]] = {
    "rewritten in place": rewrite_in_place, "swapped in": swap_in}


def built_readers(url: str, verify: TLSVerify) -> list[Callable[[], list[object]]]:
    """Both readers of ``url``, built once and read again after the bundle changes."""
    source = AlertSource(url, "chat", namespace="team", verify=verify)
    query = query_at(url, verify=verify)
    return [lambda: list(source.firing()), lambda: list(query("up", None))]


def refused(read: Callable[[], list[object]]) -> bool:
    try:
        read()
    except PrometheusUnavailable as exc:
        assert "certificate verification failed" in str(exc)
        return True
    return False


@pytest.mark.parametrize("rotate", sorted(ROTATIONS))
def test_a_rotated_ca_bundle_is_what_readers_built_before_it_trust(
        tmp_path: Path, rotate: str) -> None:
    # cert-manager or the kubelet rewrites the mounted bundle while the operator runs:
    # its controllers' readers, built once, must verify against the bundle on disk now.
    old, new = throwaway_ca(tmp_path / "old"), throwaway_ca(tmp_path / "new")
    trust = tmp_path / "trust.pem"
    trust.write_bytes(old.ca_file.read_bytes())
    verify = TLSVerify(ca_file=str(trust))
    with https_prometheus(old) as old_url, https_prometheus(new) as new_url:
        of_old, of_new = built_readers(old_url, verify), built_readers(new_url, verify)
        assert [refused(r) for r in of_old + of_new] == [False, False, True, True]
        ROTATIONS[rotate](trust, new.ca_file.read_bytes())
        # The old CA is trusted no more: the bundle is replaced, not added to.
        assert [refused(r) for r in of_old + of_new] == [True, True, False, False]


@pytest.mark.parametrize("broken", ["half-written", "garbage", "empty", "gone"])
def test_a_bundle_rewritten_unreadable_keeps_the_one_trusted_before_and_warns_once(
        ca: ThrowawayCA, tmp_path: Path, broken: str,
        caplog: pytest.LogCaptureFixture) -> None:
    trust = tmp_path / "trust.pem"
    pem = ca.ca_file.read_bytes()
    trust.write_bytes(pem)
    verify = TLSVerify(ca_file=str(trust))
    with https_prometheus(ca) as url, caplog.at_level(
            logging.WARNING, logger="slopilot.tuner.prometheus.tls"):
        readers = built_readers(url, verify)
        assert [read() for read in readers] == [[], []]
        if broken == "gone":
            trust.unlink()
        else:
            rewrite_in_place(trust, {"half-written": pem[:len(pem) // 2],
                                     "garbage": b"not a certificate\n", "empty": b""}[broken])
        # Never unverified, never refused for it: the bundle trusted before still counts.
        assert [read() for read in readers + readers] == [[], [], [], []]
        (record,) = caplog.records  # once per version of the file, not per read
        message = record.getMessage()
        assert repr(str(trust)) in message
        assert "keeping the one before" in message
        assert "SLOPILOT_PROMETHEUS_CA_FILE" in message
        # Another broken version is warned of again.
        trust.write_bytes(b"still not a certificate\n")
        assert [read() for read in readers + readers] == [[], [], [], []]
        assert len(caplog.records) == 2
        # Written whole at last: read, and no further warning.
        rewrite_in_place(trust, pem)
        assert [read() for read in readers] == [[], []]
        assert len(caplog.records) == 2
