"""Every name, key, quantity and image the operator checks against a pattern is refused
with a trailing newline. Python's ``$`` also matches before a final newline; the API
server's CRD patterns (RE2) do not, and Kubernetes refuses such an image or name only
when it applies what the operator rendered: the spec is never Valid=False, the apply
fails on every retry. A unicode letter in an image tag is refused too (docker's ``\\w``
is ASCII)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from slopilot.engine.metrics import EngineMetrics
from slopilot.operator import quantity
from slopilot.operator.crd import API_VERSION, KIND
from slopilot.operator.handlers import controlling_owner
from slopilot.operator.model_source import parse_token_secret, parse_volume
from slopilot.operator.network_peers import Peer, PeerError
from slopilot.operator.policy import OperatorPolicy, PolicyError, check_dcgm_namespace
from slopilot.operator.scheduling import label_key_problem, label_value_problem, parse_scheduling
from slopilot.operator.twin_spec import key_problem, name_problem
from slopilot.operator.validation import (
    deployment_name_problem,
    parse_image,
    quantity_problem,
)
from slopilot.tuner.prometheus.rules import RuleError, check_namespace_label, render_selector


def _raises(call: Callable[[], object], *errors: type[Exception]) -> bool:
    try:
        call()
    except errors:
        return False
    return True


def _volume(claim: str, sub: str = "m") -> bool:
    problems: list[str] = []
    parse_volume({"volume": {"claimName": claim, "subPath": sub}}, "/models/m", problems, [])
    return not problems


def _secret(name: str, key: str = "token") -> bool:
    problems: list[str] = []
    parse_token_secret({"tokenSecret": {"name": name, "key": key}}, True, problems)
    return not problems


def _priority(name: str) -> bool:
    problems: list[str] = []
    parse_scheduling({"scheduling": {"priorityClassName": name}}, problems)
    return not problems


def _owner(name: str) -> bool:
    return controlling_owner({"metadata": {"ownerReferences": [
        {"kind": KIND, "apiVersion": API_VERSION, "name": name, "uid": "u",
         "controller": True}]}}) is not None


# Each check with a value it accepts: it must refuse the value with "\n" after it.
CHECKS: dict[str, tuple[Callable[[str], bool], str]] = {
    "image": (lambda v: parse_image(v) is not None, "ghcr.io/slopilot/slopilot:0.1.0"),
    "image digest": (lambda v: parse_image(v) is not None, "ghcr.io/a/b@sha256:" + "ab" * 32),
    "deployment name": (lambda v: deployment_name_problem(v) is None, "chat"),
    "quantity": (lambda v: quantity_problem("spec.resources.memory", v) is None, "16Gi"),
    "quantity amount": (lambda v: _raises(lambda: quantity.amount(v), ValueError), "1Gi"),
    "twin profile name": (lambda v: name_problem("spec.twin.profile.name", v) is None, "prof"),
    "twin profile key": (lambda v: key_problem("spec.twin.profile.key", v) is None,
                         "profile.yaml"),
    "claim name": (_volume, "models"),
    "sub path": (lambda v: _volume("models", v), "my-model"),
    "token secret": (_secret, "hf-token"),
    "token key": (lambda v: _secret("hf-token", v), "token"),
    "node selector key": (lambda v: label_key_problem("k", v) is None,
                          "topology.kubernetes.io/zone"),
    "node selector value": (lambda v: label_value_problem("v", v) is None, "us-east-1a"),
    "priority class": (_priority, "high"),
    "owner reference": (_owner, "chat"),
    "dcgm namespace": (lambda v: _raises(lambda: check_dcgm_namespace(v), PolicyError),
                       "gpu-operator"),
    "allowed priority class": (
        lambda v: _raises(lambda: OperatorPolicy(allowed_priority_classes=(v,)), PolicyError),
        "high"),
    "prometheus peer": (lambda v: _raises(lambda: Peer(v), PeerError), "monitoring"),
    "namespace label": (lambda v: _raises(lambda: check_namespace_label(v), RuleError),
                        "namespace"),
    "selector label": (lambda v: _raises(lambda: render_selector({v: "x"}), RuleError), "job"),
    "engine info label": (
        lambda v: _raises(lambda: EngineMetrics("m", info={v: "x"}), ValueError), "gpu"),
}


@pytest.mark.parametrize("check", list(CHECKS))
def test_a_trailing_newline_is_refused(check: str) -> None:
    accepts, valid = CHECKS[check]
    assert accepts(valid), f"{check}: {valid!r} should be accepted"
    assert not accepts(valid + "\n"), f"{check}: {valid + chr(10)!r} was accepted"


def test_an_image_tag_is_ascii() -> None:
    assert parse_image("ghcr.io/slopilot/slopilot:v1") is not None
    assert parse_image("ghcr.io/slopilot/slopilot:vé") is None
