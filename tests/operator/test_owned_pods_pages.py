"""``owned_pods`` reads a tenant-writable list (ReplicaSets, pods with the CR's selector
labels) a page at a time and keeps only what the CR's own Deployment controls, at most
a bound from ``spec.replicas.max``: a tenant's junk with copied labels (ReplicaSets at
replicas 0, bare pods with 200 KB annotations) is dropped page by page, never gathered
whole, and what passes the checks past the bound is said in the log, not kept."""

from __future__ import annotations

import logging
import weakref
from collections.abc import Mapping
from typing import Any

import pytest

from slopilot.operator import kubeapi
from slopilot.operator.crd import KIND
from slopilot.operator.kubeapi import SELECT_PAGE, Kube
from slopilot.operator.owned_meta import selector
from slopilot.operator.owned_pods import REPLICA_SETS_KEPT, kept_pods, owned_pods

NS, CR_UID, DEP_UID = "team-a", "cr-uid", "dep-uid"
HASH = "5d8f7c9b4"


class Obj(dict):  # type: ignore[type-arg]
    """A dict a weak reference can follow: what the operator still holds is countable."""


def ref(kind: str, uid: str) -> dict[str, Any]:
    return {"kind": kind, "uid": uid, "controller": True, "blockOwnerDeletion": True}


def rs(name: str, owner: str | None) -> Obj:
    return Obj(metadata={"name": name, "uid": f"rs-{name}",
                         "labels": {**selector("chat"), "pod-template-hash": HASH},
                         "ownerReferences": [ref("Deployment", owner)] if owner else [],
                         "annotations": {"a": "y" * 1000}})


def pod(name: str, rs_uid: str | None) -> Obj:
    return Obj(metadata={"name": name, "labels": {**selector("chat"),
                                                  "pod-template-hash": HASH},
                         "ownerReferences": [ref("ReplicaSet", rs_uid)] if rs_uid else [],
                         "annotations": {"a": "y" * 1000}})


class Paged(Kube):
    """An API server of one Deployment, and ReplicaSets and pods served a page per GET
    at the ``limit`` asked; at each page asked, how many objects of the earlier pages are
    still alive is noted (``alive``)."""

    def __init__(self, sets: list[Obj], pods: list[Obj]) -> None:
        self.objects = {"replicasets": sets, "pods": pods}
        self.served: list[weakref.ref[Obj]] = []
        self.alive: list[int] = []
        self.limits: list[str] = []

    def request(self, method: str, path: str, *, body: Any = None,
                query: Mapping[str, str] | None = None,
                content_type: str = "application/json") -> Any:
        if path.endswith("/deployments/chat"):
            return {"metadata": {"name": "chat", "uid": DEP_UID,
                                 "ownerReferences": [ref(KIND, CR_UID)]}}
        query = dict(query or {})
        items = self.objects[path.rsplit("/", 1)[1]]
        self.alive.append(sum(r() is not None for r in self.served))
        self.limits.append(query["limit"])
        start, limit = int(query.get("continue", "0")), int(query["limit"])
        # Copies, as a response parsed anew is: the test's own list holds none alive.
        page = [Obj(o) for o in items[start:start + limit]]
        self.served += [weakref.ref(o) for o in page]
        more = {"continue": str(start + limit)} if start + limit < len(items) else {}
        return {"metadata": more, "items": page}


def test_junk_with_the_crs_labels_is_dropped_page_by_page_not_gathered() -> None:
    """300 ReplicaSets and 300 pods that carry the selector labels but are none of the
    Deployment's: as each page is asked, none of the earlier pages' junk is held."""
    sets = [rs("chat-own", DEP_UID)] + [rs(f"junk-{i}", None) for i in range(300)]
    pods = [pod("chat-own-1", "rs-chat-own")] + [pod(f"junk-{i}", None) for i in range(300)]
    kube = Paged(sets, pods)
    found = owned_pods(kube, NS, "chat", CR_UID, max_replicas=2)
    assert [s["metadata"]["name"] for s in found.replica_sets] == ["chat-own"]
    assert [p["metadata"]["name"] for p in found.pods] == ["chat-own-1"]
    assert set(kube.limits) == {str(SELECT_PAGE)}
    # Alive as each page is asked: what was kept (a ReplicaSet, a pod) and the last
    # object looked at; never the page before it (SELECT_PAGE of them), nor the list.
    assert max(kube.alive) <= 3, kube.alive


def test_past_the_bound_the_rest_is_dropped_and_said(
        caplog: pytest.LogCaptureFixture) -> None:
    """Forged ReplicaSets the Deployment 'controls' (an owner reference anyone who can
    create one may write) and pods they 'made': kept up to the bound, the rest counted
    and named in a warning."""
    sets = [rs(f"chat-{i:03}", DEP_UID) for i in range(40)]
    pods = [pod(f"chat-{i:03}-x", "rs-chat-000") for i in range(40)]
    kube = Paged(sets, pods)
    with caplog.at_level(logging.WARNING):
        found = owned_pods(kube, NS, "chat", CR_UID, max_replicas=3)
    assert len(found.replica_sets) == REPLICA_SETS_KEPT
    assert len(found.pods) == kept_pods(3)
    assert found.unkept == (40 - REPLICA_SETS_KEPT) + (40 - kept_pods(3))
    said = " ".join(r.getMessage() for r in caplog.records)
    assert f"{NS}/chat" in said and "spec.replicas.max=3" in said
    assert str(40 - kept_pods(3)) in said


def test_an_honest_namespace_is_one_page_each() -> None:
    """The CR's own objects (a rollout's two ReplicaSets, max + 1 pods) in one page."""
    sets = [rs("chat-a", DEP_UID), rs("chat-b", DEP_UID)]
    pods = [pod(f"chat-a-{i}", "rs-chat-a") for i in range(5)]
    kube = Paged(sets, pods)
    found = owned_pods(kube, NS, "chat", CR_UID, max_replicas=4)
    assert len(found.pods) == 5 and found.unkept == 0
    assert len(kube.limits) == 2


def test_the_selected_list_restarts_whole_on_an_expired_token() -> None:
    """``Kube.select`` keeps the list's 410 restart: the first attempt's kept objects are
    not counted twice."""
    calls = {"n": 0}

    class Expiring(Kube):
        def __init__(self) -> None:
            pass

        def request(self, method: str, path: str, *, body: Any = None,
                    query: Mapping[str, str] | None = None,
                    content_type: str = "application/json") -> Any:
            calls["n"] += 1
            if (query or {}).get("continue") and calls["n"] == 2:
                raise kubeapi.ApiError(410, "Expired", "too old")
            page = int((query or {}).get("continue", "0"))
            return {"metadata": {"continue": "1"} if page == 0 else {},
                    "items": [{"metadata": {"name": f"p{page}"}}]}

    got = Expiring().select("v1", "pods", NS, keep=lambda o: True, most=10, page=1)
    assert [o["metadata"]["name"] for o in got.items] == ["p0", "p1"]
    assert got.unkept == 0
