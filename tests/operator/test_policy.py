"""What a CR author may point the operator at: Prometheus URLs and images (policy.py)."""

from __future__ import annotations

from typing import Any

import pytest

from slopilot.operator.policy import OperatorPolicy, PolicyError, policy_problems
from slopilot.operator.settings import operator_policy
from slopilot.operator.spec import SpecError, parse_spec
from slopilot.operator.validation import parse_image, prometheus_url_problem


def spec_of(**fields: Any) -> Any:
    return parse_spec({"spec": {"model": {"name": "m"}, **fields}})


@pytest.mark.parametrize(("url", "needle"), [
    ("ftp://prom:9090", "the scheme must be http or https"),
    ("http://", "no host"),
    ("http://:9090", "no host"),
    ("http://admin:pw@prom:9090", "user info is not allowed"),
    ("http://prom@10.0.0.1:9090", "user info is not allowed"),
    ("http://10.0.0.1:8080/?x=", "a query string is not allowed"),
    ("http://10.0.0.1:8080/internal?", "a query string is not allowed"),
    ("http://prom:9090/#frag", "a fragment is not allowed"),
    ("http://prom:99999", "Port out of range"),
    ("http://prom:0", "port 0 is not a port"),
    ("http://prom :9090", "white space"),
])
def test_a_url_the_operator_must_not_fetch_is_refused_by_field(url: str, needle: str) -> None:
    with pytest.raises(SpecError) as err:
        spec_of(prometheus={"url": url})
    assert any("spec.prometheus.url" in p and needle in p for p in err.value.problems), \
        err.value.problems


@pytest.mark.parametrize("url", ["http://prometheus-operated.monitoring:9090",
                                 "https://prom.example.com/prefix/", "http://10.0.0.7:9090",
                                 "http://[fd00::1]:9090"])
def test_ordinary_prometheus_urls_pass(url: str) -> None:
    assert prometheus_url_problem(url) is None
    assert spec_of(prometheus={"url": url}).prometheus_url == url


def test_the_prometheus_allow_list_keeps_the_operator_to_known_hosts() -> None:
    policy = OperatorPolicy(allowed_prometheus=("prometheus-operated.monitoring:9090",
                                                "*.monitoring.svc.cluster.local"))
    assert policy.prometheus_allowed("http://prometheus-operated.monitoring:9090/")
    assert policy.prometheus_allowed("https://a.monitoring.svc.cluster.local")
    assert not policy.prometheus_allowed("http://prometheus-operated.monitoring:9091")
    assert not policy.prometheus_allowed("http://10.0.0.1:9090")
    assert not policy.prometheus_allowed("http://evilmonitoring.svc.cluster.local")
    assert OperatorPolicy().prometheus_allowed("http://10.0.0.1:9090")  # no list: any host
    problems = policy_problems(spec_of(prometheus={"url": "http://10.0.0.1:9090"}), policy)
    assert len(problems) == 1 and "SLOPILOT_ALLOWED_PROMETHEUS" in problems[0]


@pytest.mark.parametrize(("image", "allowed"), [
    ("ghcr.io/slopilot/slopilot:0.1.0", True),
    ("ghcr.io/slopilot/slopilot@sha256:" + "a" * 64, True),
    ("vllm/vllm-openai:v0.11.0", True),
    ("docker.io/vllm/vllm-openai:latest", True),
    ("ghcr.io/slopilot/slopilot-evil:0.1.0", False),
    ("ghcr.io/slopilot/slopilot/sub:1", False),
    ("evil.io/vllm/vllm-openai:v0.11.0", False),
    ("vllm/vllm-openai-debug:1", False),
    ("ubuntu:22.04", False),
    ("Not An Image", False),
])
def test_only_allow_listed_images_run(image: str, allowed: bool) -> None:
    spec = spec_of(image=image)
    problems = policy_problems(spec, OperatorPolicy())
    assert (problems == []) is allowed, problems
    if not allowed:
        assert problems[0].startswith("spec.image=")


def test_an_admin_widens_or_narrows_the_image_list() -> None:
    policy = operator_policy({"SLOPILOT_ALLOWED_IMAGES": "registry.acme.internal/llm/*, "
                                                         "docker.io/acme/engine"})
    assert policy.image_allowed("registry.acme.internal/llm/team-a/engine:3")
    assert policy.image_allowed("acme/engine:1")
    assert not policy.image_allowed("registry.acme.internal/llmx/engine:3")
    assert not policy.image_allowed("ghcr.io/slopilot/slopilot:0.1.0")
    # The default image is judged too: a backend whose default is not allowed is refused.
    problems = policy_problems(spec_of(), policy)
    assert problems and "the builtin default image" in problems[0]
    assert operator_policy({"SLOPILOT_ALLOWED_IMAGES": "*"}).image_allowed("ubuntu")


@pytest.mark.parametrize("entry", ["ghcr.io/acme/engine:1.0", "not an image", "a@b"])
def test_a_bad_allow_list_entry_names_the_variable(entry: str) -> None:
    with pytest.raises(PolicyError, match=r"SLOPILOT_ALLOWED_IMAGES"):
        operator_policy({"SLOPILOT_ALLOWED_IMAGES": entry})


def test_image_references_normalize_as_docker_does() -> None:
    assert parse_image("ubuntu").repository == "docker.io/library/ubuntu"  # type: ignore[union-attr]
    assert parse_image("localhost:5000/x:1").repository == "localhost:5000/x"  # type: ignore[union-attr]
    assert parse_image("index.docker.io/vllm/vllm-openai").repository \
        == "docker.io/vllm/vllm-openai"  # type: ignore[union-attr]
    assert parse_image("UPPER/case") is None
