"""The administrator decides how the operator checks an https Prometheus (settings.py).

Verified by default; ``SLOPILOT_PROMETHEUS_CA_FILE`` names the CA to trust (checked at
the start, and followed on disk after it: a rotated CA needs no restart);
``SLOPILOT_PROMETHEUS_TLS_VERIFY=false`` turns the check off for
every deployment. The choice travels from the policy, through ``build``'s
``DaemonContext``, to every port ``prometheus_controller`` reads Prometheus with, and
no CR can change it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from slopilot.operator.controller_build import build
from slopilot.operator.daemon import DaemonContext, prometheus_controller
from slopilot.operator.kube_handle import KubeDeploymentHandle
from slopilot.operator.policy import OperatorPolicy, PolicyError
from slopilot.operator.settings import (
    PROMETHEUS_CA_ENV,
    PROMETHEUS_TLS_VERIFY_ENV,
    operator_policy,
)
from slopilot.operator.tokens import TokenMint
from slopilot.tuner.loop.controller import Controller
from slopilot.tuner.loop.errors import ControllerError
from slopilot.tuner.prometheus.alerts import AlertSource
from slopilot.tuner.prometheus.tls import TRUST_FIX, TLSVerify
from slopilot.tuner.study.evaluator import PrometheusUnavailable
from tests.support.tls import ThrowawayCA, https_prometheus, swap_in, throwaway_ca


@pytest.fixture
def ca(tmp_path: Path) -> ThrowawayCA:
    return throwaway_ca(tmp_path / "ca")


@pytest.mark.parametrize("env", [{}, {PROMETHEUS_TLS_VERIFY_ENV: "true"},
                                 {PROMETHEUS_TLS_VERIFY_ENV: ""}, {PROMETHEUS_CA_ENV: " "}])
def test_certificates_are_verified_unless_the_administrator_says_otherwise(
        env: dict[str, str]) -> None:
    assert operator_policy(env).prometheus_tls == TLSVerify(enabled=True, ca_file=None)
    assert OperatorPolicy().prometheus_tls == TLSVerify()


def test_the_administrators_ca_bundle_is_what_the_operator_trusts(ca: ThrowawayCA) -> None:
    policy = operator_policy({PROMETHEUS_CA_ENV: str(ca.ca_file)})
    assert policy.prometheus_tls == TLSVerify(ca_file=str(ca.ca_file))


@pytest.mark.parametrize(("content", "why"), [
    (None, "cannot be read: No such file or directory"),
    (b"", "holds no PEM certificate"),
    (b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
     "holds no PEM certificate"),
    ("dir", "cannot be read: Is a directory")])
def test_an_unusable_ca_bundle_stops_the_start_naming_the_variable_and_the_fix(
        tmp_path: Path, content: bytes | str | None, why: str) -> None:
    path = tmp_path / "ca.pem"
    if content == "dir":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    with pytest.raises(PolicyError) as info:
        operator_policy({PROMETHEUS_CA_ENV: str(path)})
    message = str(info.value)
    assert message.startswith(f"{PROMETHEUS_CA_ENV}: the CA bundle {str(path)!r} {why}")
    assert "mount the PEM certificate of the CA" in message and "or unset it" in message


def test_verification_off_is_the_administrators_explicit_choice_and_warned_of(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="slopilot.operator.settings"):
        policy = operator_policy({PROMETHEUS_TLS_VERIFY_ENV: "false"})
    assert policy.prometheus_tls == TLSVerify(enabled=False)
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert f"{PROMETHEUS_TLS_VERIFY_ENV}=false" in record.getMessage()
    assert PROMETHEUS_CA_ENV in record.getMessage()


@pytest.mark.parametrize("raw", ["False", "FALSE", "0", "no", "off", "yes", "1", " false",
                                 "false ", "TRUE"])
def test_the_switch_reads_true_or_false_and_nothing_looser(raw: str) -> None:
    with pytest.raises(PolicyError) as info:
        operator_policy({PROMETHEUS_TLS_VERIFY_ENV: raw})
    assert str(info.value) == (f"{PROMETHEUS_TLS_VERIFY_ENV}={raw!r}: expected true or "
                               "false (unset: true, certificates verified)")


def test_a_ca_with_verification_off_is_refused_as_contradictory(ca: ThrowawayCA) -> None:
    with pytest.raises(PolicyError, match=f"{PROMETHEUS_TLS_VERIFY_ENV}=false with "
                                          f"{PROMETHEUS_CA_ENV}=.*unset one of them"):
        operator_policy({PROMETHEUS_TLS_VERIFY_ENV: "false",
                         PROMETHEUS_CA_ENV: str(ca.ca_file)})


def test_a_refused_certificate_names_the_variable_the_operator_reads() -> None:
    # The tuner words the fix; the operator owns the variable: they must not drift apart.
    assert PROMETHEUS_CA_ENV in TRUST_FIX


class NoDeploymentYet:
    """The cluster before the reconcile made the CR's Deployment: nothing to refuse, and
    the build's one write (its record of the study's storage, study_ledger.py) taken."""

    def __init__(self) -> None:
        self.created: list[Any] = []

    def get(self, *args: Any) -> None:
        return None

    def create(self, *args: Any) -> dict[str, Any]:
        self.created.append(args[-1])
        return dict(args[-1])


def cr(url: str, tmp_path: Path, **prometheus: Any) -> dict[str, Any]:
    return {"apiVersion": "slopilot.dev/v1alpha1", "kind": "LLMDeployment",
            "metadata": {"name": "chat", "namespace": "team", "uid": "u1", "generation": 1},
            "spec": {"model": {"name": "smollm2-135m"},
                     "prometheus": {"url": url, **prometheus},
                     "tuning": {"enabled": True,
                                "storage": f"sqlite:///{tmp_path / 'study.db'}"}}}


def built(body: dict[str, Any], tmp_path: Path, tls: TLSVerify) -> tuple[DaemonContext,
                                                                           Controller]:
    """``build`` as the daemon calls it, with the production factory; and its context."""
    seen: list[DaemonContext] = []

    def factory(ctx: DaemonContext) -> Controller:
        seen.append(ctx)
        return prometheus_controller(ctx)

    kube: Any = NoDeploymentYet()
    policy = OperatorPolicy(allowed_storage=(f"sqlite:///{tmp_path / 'study.db'}",),
                            prometheus_tls=tls)
    handle = KubeDeploymentHandle(kube, "team", "chat", mint=TokenMint(b"k" * 32), uid="u1",
                                  policy=policy)
    controller = build(kube, handle, body, factory, policy)
    (ctx,) = seen
    return ctx, controller


def read_every_port(controller: Controller) -> list[object]:
    """An alert read and a query (the one the windows, probe and iterations share)."""
    assert isinstance(controller.alerts, AlertSource)
    query = controller.evaluator.query  # type: ignore[attr-defined]
    assert controller.probe.query is query  # type: ignore[attr-defined]
    return [controller.alerts.firing(), query("up", None)]


def test_the_policys_ca_reaches_every_read_of_the_controller(ca: ThrowawayCA,
                                                            tmp_path: Path) -> None:
    tls = TLSVerify(ca_file=str(ca.ca_file))
    with https_prometheus(ca) as url:
        ctx, controller = built(cr(url, tmp_path), tmp_path, tls)
        assert ctx.prometheus_tls == tls
        assert isinstance(controller.alerts, AlertSource) and controller.alerts.verify == tls
        assert read_every_port(controller) == [[], []]


def test_verification_off_in_the_policy_reaches_every_read(ca: ThrowawayCA,
                                                           tmp_path: Path) -> None:
    with https_prometheus(ca) as url:
        _, controller = built(cr(url, tmp_path), tmp_path, TLSVerify(enabled=False))
        assert read_every_port(controller) == [[], []]


def test_a_cr_cannot_turn_verification_off(ca: ThrowawayCA, tmp_path: Path) -> None:
    # Fields a tenant might try: the CRD has none such, and the parse reads only the URL.
    body = cr("", tmp_path, insecureSkipVerify=True, tlsVerify=False,
              tlsConfig={"insecureSkipVerify": True})
    with https_prometheus(ca) as url:
        body["spec"]["prometheus"]["url"] = url
        ctx, controller = built(body, tmp_path, TLSVerify())
        assert ctx.prometheus_tls == TLSVerify()
        assert isinstance(controller.alerts, AlertSource)
        with pytest.raises(PrometheusUnavailable, match="certificate verification failed"):
            controller.alerts.firing()
        with pytest.raises(PrometheusUnavailable, match="certificate verification failed"):
            controller.evaluator.query("up", None)  # type: ignore[attr-defined]


def test_a_rotated_ca_reaches_the_running_controller_without_a_restart(
        tmp_path: Path) -> None:
    # The Secret or ConfigMap volume the administrator mounted is updated by the kubelet
    # (cert-manager renewed the CA): the policy read at the start and the controller built
    # then are the ones that must read the Prometheus the new CA signed.
    old, new = throwaway_ca(tmp_path / "old"), throwaway_ca(tmp_path / "new")
    trust = tmp_path / "trust.pem"
    trust.write_bytes(old.ca_file.read_bytes())
    tls = operator_policy({PROMETHEUS_CA_ENV: str(trust)}).prometheus_tls
    with https_prometheus(new) as url:
        _, controller = built(cr(url, tmp_path), tmp_path, tls)
        with pytest.raises(PrometheusUnavailable, match="certificate verification failed"):
            read_every_port(controller)
        swap_in(trust, new.ca_file.read_bytes())
        assert read_every_port(controller) == [[], []]


def test_a_ca_bundle_gone_since_the_start_keeps_the_one_read_there_with_a_warning(
        ca: ThrowawayCA, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Never unverified, and no controller refused for it: the CA read at the start
    # still signs what it signed then.
    tls = operator_policy({PROMETHEUS_CA_ENV: str(ca.ca_file)}).prometheus_tls
    ca.ca_file.unlink()
    with https_prometheus(ca) as url, caplog.at_level(logging.WARNING):
        _, controller = built(cr(url, tmp_path), tmp_path, tls)
        assert read_every_port(controller) == [[], []]
    (record,) = [r for r in caplog.records if r.name == "slopilot.tuner.prometheus.tls"]
    assert "No such file or directory" in record.getMessage()


def test_a_ca_bundle_never_read_is_a_controller_error_naming_the_variable(
        tmp_path: Path) -> None:
    # A policy made elsewhere than settings.py, whose start read the bundle: no bundle
    # trusted yet to keep.
    tls = TLSVerify(ca_file=str(tmp_path / "absent.pem"))
    with pytest.raises(ControllerError, match=f"{PROMETHEUS_CA_ENV}: the CA bundle "
                                              ".*No such file or directory"):
        built(cr("https://prom.monitoring:9090", tmp_path), tmp_path, tls)
