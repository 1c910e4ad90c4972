"""``Kube.list`` reads a list in pages (``limit`` and ``continue``), as kubectl and
client-go do, so a namespace of thousands of pods is never one response held whole; and
an API server that never stops handing out continue tokens cannot keep it reading."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import kubernetes.client
import pytest

from slopilot.operator import kubeapi
from slopilot.operator.kubeapi import ApiError, Kube, ListError
from tests.operator.operator_support import NS, Cluster
from tests.support.kube_server import RunningEmulator

Answer = Callable[[Mapping[str, str]], Any]


class Scripted(Kube):
    """A Kube whose API server answers each GET with ``answer(query)``; every query kept."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.queries: list[dict[str, str]] = []

    def request(self, method: str, path: str, *, body: Any = None,
                query: Mapping[str, str] | None = None,
                content_type: str = "application/json") -> Any:
        assert (method, path) == ("GET", f"/api/v1/namespaces/{NS}/pods")
        self.queries.append(dict(query or {}))
        return self.answer(dict(query or {}))


def pod(n: int) -> dict[str, Any]:
    return {"metadata": {"name": f"p{n}"}}


def pages(count: int, *, per: int = 2) -> Answer:
    """``count`` pages of ``per`` pods, each but the last with a continue token."""
    def answer(query: Mapping[str, str]) -> Any:
        page = int(query.get("continue", "0"))
        more = {"continue": str(page + 1)} if page + 1 < count else {}
        return {"metadata": more, "items": [pod(page * per + i) for i in range(per)]}
    return answer


def test_pages_are_joined_in_order_and_each_asks_with_the_selector() -> None:
    kube = Scripted(pages(3))
    got = kube.list("v1", "pods", NS, label_selector="app=chat")
    assert [p["metadata"]["name"] for p in got] == [f"p{n}" for n in range(6)]
    limit = str(kubeapi.LIST_PAGE)
    assert kube.queries == [
        {"labelSelector": "app=chat", "limit": limit},
        {"labelSelector": "app=chat", "limit": limit, "continue": "1"},
        {"labelSelector": "app=chat", "limit": limit, "continue": "2"}]


def test_an_expired_continue_token_restarts_the_list_once() -> None:
    """A continue token lives about five minutes (etcd's compaction): a list that took
    longer is read again from its start, as one whole, not half of one and half of the
    other."""
    expired = {"left": 1}
    whole = pages(3)

    def answer(query: Mapping[str, str]) -> Any:
        if query.get("continue") == "2" and expired["left"]:
            expired["left"] -= 1
            raise ApiError(410, "Expired", "The provided continue parameter is too old")
        return whole(query)

    kube = Scripted(answer)
    got = kube.list("v1", "pods", NS)
    assert [p["metadata"]["name"] for p in got] == [f"p{n}" for n in range(6)]
    assert [q.get("continue") for q in kube.queries] == [None, "1", "2", None, "1", "2"]


def _refusing_later_pages(error: ApiError) -> Scripted:
    """An API server whose first page says there is more, and which refuses the rest."""
    def answer(query: Mapping[str, str]) -> Any:
        if "continue" in query:
            raise error
        return {"metadata": {"continue": "1"}, "items": [pod(0)]}

    return Scripted(answer)


def test_a_token_that_expires_again_is_an_error_naming_the_list() -> None:
    kube = _refusing_later_pages(
        ApiError(410, "Expired", "The provided continue parameter is too old"))
    with pytest.raises(ListError, match=rf"pods in namespace {NS} \(labelSelector "
                                        r"app=chat\): .*expired .* again"):
        kube.list("v1", "pods", NS, label_selector="app=chat")
    assert len(kube.queries) == 4  # the list and its restart, two pages each


def test_other_errors_of_a_page_are_not_retried() -> None:
    kube = _refusing_later_pages(ApiError(500, "InternalError", "etcd is down"))
    with pytest.raises(ApiError, match="etcd is down"):
        kube.list("v1", "pods", NS)
    assert len(kube.queries) == 2


@pytest.mark.parametrize("per", [0, 1])
def test_an_api_server_that_never_stops_paging_is_refused(per: int) -> None:
    """A broken or hostile API server (or a proxy in front of one) that answers every
    page with another continue token, empty pages included, had the list read forever."""
    kube = Scripted(pages(10 ** 9, per=per))
    with pytest.raises(ListError, match=rf"pods in namespace {NS}: .* still had more "
                                        rf"after {kubeapi.MAX_LIST_PAGES} pages"):
        kube.list("v1", "pods", NS)
    assert len(kube.queries) == kubeapi.MAX_LIST_PAGES


def test_pages_past_the_bound_on_objects_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pages larger than asked (a server that ignores ``limit``) count too."""
    monkeypatch.setattr(kubeapi, "MAX_LIST_ITEMS", 5)
    kube = Scripted(pages(3, per=4))
    with pytest.raises(ListError, match=r"more than 5 objects \(MAX_LIST_ITEMS\)"):
        kube.list("v1", "pods", NS)
    assert len(kube.queries) == 2


def test_the_emulator_pages_a_selected_list_as_an_api_server_does(
        kube: RunningEmulator, cluster: Cluster, kube_client: kubernetes.client.ApiClient,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Over HTTP, against the emulator's own paging: every page filtered by the
    selector, none skipped or repeated."""
    for app in ("chat", "other"):
        for i in range(7):
            cluster.core.create_namespaced_pod(NS, {
                "metadata": {"name": f"{app}-{i}", "labels": {"app": app}},
                "spec": {"containers": [{"name": "engine", "image": "x"}]}})
    monkeypatch.setattr(kubeapi, "LIST_PAGE", 3)
    got = Kube(kube_client).list("v1", "pods", NS, label_selector="app=chat")
    assert [p["metadata"]["name"] for p in got] == [f"chat-{i}" for i in range(7)]
    lists = [r.params for r in list(kube.emulator._requests)
             if r.method.value == "GET" and r.resource is not None
             and r.resource.plural == "pods" and r.name is None]
    assert [(q.get("limit"), q.get("labelSelector"), "continue" in q) for q in lists] == \
        [("3", "app=chat", False), ("3", "app=chat", True), ("3", "app=chat", True)]
