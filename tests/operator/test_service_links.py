"""A CR's name names its Service, and the kubelet gives every pod of the namespace whose
service links are on (Kubernetes' default) that Service's address as environment
variables: ``<NAME>_SERVICE_HOST``, ``<NAME>_SERVICE_PORT``, ``<NAME>_PORT=tcp://IP:PORT``.

A CR named ``vllm`` gave ``VLLM_PORT=tcp://10.x:8000``, which vLLM reads as its own
internal port and refuses to start on ("appears to be a URI"): its own pods and every
vLLM pod started after it in the namespace crash-looped. One named ``kubernetes`` pointed
``KUBERNETES_SERVICE_HOST``/``PORT`` of every new pod there at the engine's plain HTTP
port, and every in-cluster API client failed. So the operator's pods take no service
links, and a name whose links would set a variable that servers read is refused."""

from __future__ import annotations

import pytest

from slopilot.operator.render import render_all
from slopilot.operator.validation import deployment_name_problem, service_link_variables
from tests.operator.test_render import render


@pytest.mark.parametrize(("name", "variable"), [
    ("kubernetes", "KUBERNETES_SERVICE_HOST"),
    ("vllm", "VLLM_PORT"),
    ("vllm-dp-master", "VLLM_DP_MASTER_PORT"),
    ("vllm-nixl-side-channel", "VLLM_NIXL_SIDE_CHANNEL_PORT"),
    ("master", "MASTER_PORT"),
])
def test_a_name_whose_service_links_set_a_variable_servers_read_is_refused(
        name: str, variable: str) -> None:
    problem = deployment_name_problem(name)
    assert problem is not None and variable in problem and "rename" in problem, problem


@pytest.mark.parametrize("name", ["chat", "vllm-chat", "llama-vllm", "kubernetes-docs"])
def test_names_whose_links_set_nothing_read_are_kept(name: str) -> None:
    assert deployment_name_problem(name) is None


def test_the_variables_a_service_gives_are_the_kubelets() -> None:
    assert service_link_variables("vllm-chat") == {
        "VLLM_CHAT_SERVICE_HOST", "VLLM_CHAT_SERVICE_PORT", "VLLM_CHAT_PORT"}


@pytest.mark.parametrize("backend", ["builtin", "vllm"])
def test_the_operators_pods_take_no_service_links(backend: str) -> None:
    b, spec = render(backend=backend)
    pod = render_all(b, spec).deployment["spec"]["template"]["spec"]
    assert pod["enableServiceLinks"] is False
