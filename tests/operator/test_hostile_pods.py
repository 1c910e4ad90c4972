"""A tenant's image answers the operator's calls to its admin API: whatever it answers,
what the operator writes and sends because of it stays bounded.

The sync of a deployment's pods runs once a minute (deployment_loop.CONFIG_SYNC_S), by the
timer while tuning is off and by the daemon while it is on; both record what it found in
the PodsConfigured condition (pods_status.py).
"""

# CustomObjectsApi (client 37) returns ``object``; the bodies are dicts.
# mypy: disable-error-code="index,union-attr"

from __future__ import annotations

import itertools
import threading
from typing import Any

import kopf
import pytest

from slopilot.operator.deployment_loop import CONFIG_SYNC_S
from slopilot.operator.pod_memory import MEMO_KEY, PodMemory
from slopilot.operator.spec import parse_spec
from tests.operator.operator_support import NS, Cluster, add_pod, daemon_loop, llmd, sync_timer
from tests.operator.standins import PodStandIn, PrometheusStandIn, serving
from tests.operator.test_live_config import (
    Clock,
    _pods_condition,
    _status_writes,
    handle_of,
    handler_memo,
    reconciled,
    spec_config,
)
from tests.support.kube_server import RunningEmulator


class Pods:
    """A reconciled ``chat`` with tuning off, its pods' stand-ins, and the timer's sync."""

    def __init__(self, kube: RunningEmulator, cluster: Cluster, count: int) -> None:
        _, policy, mint = reconciled(kube, cluster, llmd(tuning={"enabled": False}))
        self.cluster = cluster
        self.want = spec_config(cluster)
        self.token = mint.for_body(cluster.get())
        self.slo = parse_spec(cluster.get()).slo.to_dict()
        self.standins = [PodStandIn(self.token, self.want, self.slo) for _ in range(count)]
        self.memo = handler_memo(cluster, policy, mint)

    def add(self) -> None:
        for i, pod in enumerate(self.standins):
            add_pod(self.cluster, "chat", i, pod.port)

    def sync(self) -> None:
        sync_timer(self.cluster.get(), self.memo)


@pytest.mark.parametrize("varies", ["restart-knob", "error-content-type"])
def test_a_pod_answering_anew_each_sync_does_not_rewrite_the_condition(
        kube: RunningEmulator, cluster: Cluster, varies: str) -> None:
    """The condition's message quotes what a pod answered (a restart knob's value, an
    error's content type): an image that answered something new each time had the CR's
    status written at every sync, once a minute for as long as it ran. The condition is
    written when its meaning changes (its status, its reason, the pods it names)."""
    pods = Pods(kube, cluster, 2)
    shifty = pods.standins[1]
    asked = itertools.count()

    def answer_anew(method: str, path: str) -> None:
        if (method, path) != ("GET", "/admin/config"):
            return
        n = next(asked)
        with shifty.lock:
            if varies == "restart-knob":
                shifty.config = {**pods.want, "block_size": 32 + n}
            else:
                shifty.raw_gets[path] = (500, f"text/x-{n}", b"{}")

    shifty.on_request = answer_anew
    with serving(*pods.standins):
        pods.add()
        pods.sync()
        cond = _pods_condition(cluster)
        assert cond is not None and cond["status"] == "False", cond
        assert cond["message"].startswith("chat-pod-1"), cond
        writes = _status_writes(kube)
        for _ in range(3):
            pods.sync()
        assert next(asked) == 4  # every sync asked it, and it answered anew
    assert _status_writes(kube) == writes
    assert _pods_condition(cluster) == cond


def test_the_condition_is_written_again_once_it_names_other_pods(
        kube: RunningEmulator, cluster: Cluster) -> None:
    pods = Pods(kube, cluster, 2)
    with serving(*pods.standins):
        pods.add()
        with pods.standins[1].lock:
            pods.standins[1].config = {**pods.want, "block_size": 32}
        pods.sync()
        assert _pods_condition(cluster)["message"].startswith("chat-pod-1"), \
            _pods_condition(cluster)
        with pods.standins[0].lock:
            pods.standins[0].config = {**pods.want, "swap_space_gb": 1}
        pods.sync()
        cond: dict[str, Any] = _pods_condition(cluster)
    assert cond["status"] == "False"
    assert cond["message"].startswith("chat-pod-0: runs swap_space_gb=1"), cond
    assert "; chat-pod-1: runs block_size=32" in cond["message"]


@pytest.mark.parametrize("turns", ["WR", "WRR"], ids=["alternating", "twice-right-once-wrong"])
def test_a_pod_right_and_wrong_by_turns_has_the_status_written_a_bounded_number_of_times(
        kube: RunningEmulator, cluster: Cluster, turns: str) -> None:
    """A pod found wrong (W) at one sync and right (R) at the next had the condition and
    the pods it names flip at every sync: a status write per sync, once a minute for as
    long as it ran. A named pod is named no more once CONFIRM_SYNCS syncs in a row find
    it right, twice as many each time it comes back soon after: the writes stop."""
    pods = Pods(kube, cluster, 2)
    shifty = pods.standins[1]
    answers = itertools.cycle(turns)

    def by_turns(method: str, path: str) -> None:
        if (method, path) == ("GET", "/admin/config"):
            with shifty.lock:
                shifty.config = {**pods.want, "block_size": 32} \
                    if next(answers) == "W" else dict(pods.want)

    shifty.on_request = by_turns
    with serving(*pods.standins):
        pods.add()
        writes = _status_writes(kube)
        for _ in range(30):
            pods.sync()
        # Named (W); for WRR named no more (RR), named again (W) and then for good, as
        # it is found right at most twice in a row and now needs four.
        assert _status_writes(kube) - writes == {"WR": 1, "WRR": 3}[turns]
    assert _pods_condition(cluster)["status"] == "False"
    assert cluster.status()["pods"]["notConfigured"] == ["chat-pod-1"]


def set_ready(cluster: Cluster, pod: str, ready: bool) -> None:
    """The kubelet's record of ``pod``'s readiness probe."""
    cluster.core.patch_namespaced_pod_status(pod, NS, {"status": {"conditions": [
        {"type": "Ready", "status": "True" if ready else "False"}]}})


def cr_status_writes(kube: RunningEmulator) -> int:
    """``_status_writes`` less the pods' (``set_ready``)."""
    return sum(1 for r in list(kube.emulator._requests)
               if r.method.value == "PATCH" and r.subresource == "status"
               and r.resource is not None and r.resource.plural == "llmdeployments")


@pytest.mark.parametrize("count", [1, 2])
def test_a_wrong_pod_ready_and_not_by_turns_has_the_status_written_a_bounded_number_of_times(
        kube: RunningEmulator, cluster: Cluster, count: int) -> None:
    """The sync checks ready pods only: a named pod whose image fails its readiness
    probe at every other sync dropped out of the pods named while not ready and came
    back at the next sync, a status write per sync for as long as it ran. A pod the
    status names that is not ready, and still there, stays named."""
    pods = Pods(kube, cluster, count)
    shifty = pods.standins[-1]
    name = f"chat-pod-{count - 1}"
    with shifty.lock:
        shifty.config = {**pods.want, "block_size": 32}
    with serving(*pods.standins):
        pods.add()
        writes = cr_status_writes(kube)
        for turn in range(30):
            set_ready(cluster, name, turn % 2 == 0)
            pods.sync()
            assert cluster.status()["pods"]["notConfigured"] == [name]
        assert cr_status_writes(kube) - writes == 1  # named at the first sync
    cond = _pods_condition(cluster)
    assert cond["status"] == "False" and cond["reason"] == "PodsNotConfigured", cond


def test_a_right_pod_ready_and_not_by_turns_keeps_the_condition_as_it_was(
        kube: RunningEmulator, cluster: Cluster) -> None:
    """One replica, running what it should, whose image fails its readiness probe at
    every other sync: no ready pod read as "NoReadyPods" (Unknown), the next sync as
    "PodsConfigured" (True), a status write at every sync. A sync with no ready pod but
    pods still there has learnt nothing: the condition stays as last written. Before any
    was written, it says there is no ready pod yet."""
    pods = Pods(kube, cluster, 1)
    with serving(*pods.standins):
        pods.add()
        set_ready(cluster, "chat-pod-0", False)
        pods.sync()
        assert _pods_condition(cluster)["reason"] == "NoReadyPods"
        set_ready(cluster, "chat-pod-0", True)
        pods.sync()
        writes = cr_status_writes(kube)
        for turn in range(20):
            set_ready(cluster, "chat-pod-0", turn % 2 == 1)
            pods.sync()
        assert cr_status_writes(kube) - writes == 0
    assert _pods_condition(cluster)["status"] == "True"


@pytest.mark.parametrize("gone", ["deleted", "replaced"])
def test_a_named_pod_that_is_gone_is_named_no_more_at_the_next_sync(
        kube: RunningEmulator, cluster: Cluster, gone: str) -> None:
    """... whether or not it was ready last: a pod of the same name is another pod (its
    uid), named when a sync finds it wrong."""
    pods = Pods(kube, cluster, 2)
    with pods.standins[1].lock:
        pods.standins[1].config = {**pods.want, "block_size": 32}
    with serving(*pods.standins):
        pods.add()
        pods.sync()
        set_ready(cluster, "chat-pod-1", False)
        with pods.standins[0].lock:  # named too: the message is written again
            pods.standins[0].config = {**pods.want, "swap_space_gb": 1}
        pods.sync()
        assert cluster.status()["pods"]["notConfigured"] == ["chat-pod-0", "chat-pod-1"]
        assert "; chat-pod-1: not ready; named until 2 syncs in a row find it ready" in \
            _pods_condition(cluster)["message"]
        cluster.core.delete_namespaced_pod("chat-pod-1", NS)
        if gone == "replaced":
            add_pod(cluster, "chat", 1, pods.standins[1].port)
            set_ready(cluster, "chat-pod-1", False)
        pods.sync()
    assert cluster.status()["pods"]["notConfigured"] == ["chat-pod-0"]


def test_a_named_pod_not_ready_when_the_operator_restarts_stays_named(
        kube: RunningEmulator, cluster: Cluster) -> None:
    """The status is all a restarted operator knows of the pods it named: a named pod
    not ready at its first sync left the status, and came back at the first sync that
    found it ready and wrong, two status writes for nothing."""
    pods, _ = _one_pod_on_an_older_template(kube, cluster)
    with serving(*pods.standins):
        pods.add()
        pods.sync()
        assert cluster.status()["pods"]["notConfigured"] == ["chat-pod-1"]
        set_ready(cluster, "chat-pod-1", False)
        pods.sync()
        writes = cr_status_writes(kube)
        delattr(pods.memo, MEMO_KEY)  # the operator restarts: a new memo per CR
        pods.sync()
        assert cluster.status()["pods"]["notConfigured"] == ["chat-pod-1"]
        set_ready(cluster, "chat-pod-1", True)
        pods.sync()  # ready, and still on the older template
        assert cluster.status()["pods"]["notConfigured"] == ["chat-pod-1"]
        assert cr_status_writes(kube) - writes == 0


def _one_pod_on_an_older_template(kube: RunningEmulator,
                                  cluster: Cluster) -> tuple[Pods, PodStandIn]:
    """Two pods, the second running an older pod template's knobs (block_size=32)."""
    pods = Pods(kube, cluster, 2)
    older = pods.standins[1]
    with older.lock:
        older.config = {**pods.want, "block_size": 32}
    return pods, older


def test_a_named_pod_not_ready_for_a_while_is_named_no_more_as_any_other(
        kube: RunningEmulator, cluster: Cluster) -> None:
    """Once ready and right it leaves as a pod that was ready all along: after
    CONFIRM_SYNCS syncs in a row find it right (pod_memory.py)."""
    pods, honest = _one_pod_on_an_older_template(kube, cluster)
    with serving(*pods.standins):
        pods.add()
        pods.sync()
        set_ready(cluster, "chat-pod-1", False)
        for _ in range(3):
            pods.sync()
        with honest.lock:
            honest.config = dict(pods.want)
        set_ready(cluster, "chat-pod-1", True)
        pods.sync()  # found right once
        assert cluster.status()["pods"]["notConfigured"] == ["chat-pod-1"]
        pods.sync()
    assert cluster.status()["pods"]["notConfigured"] == []
    assert _pods_condition(cluster)["status"] == "True"


def test_a_pod_brought_over_is_named_no_more_after_two_syncs_in_a_row(
        kube: RunningEmulator, cluster: Cluster) -> None:
    """... also after an operator restart, which forgets the syncs that found it right
    (in memory, not in the status, or each would be a write): it is named a sync longer."""
    pods, older = _one_pod_on_an_older_template(kube, cluster)
    with serving(*pods.standins):
        pods.add()
        pods.sync()
        assert cluster.status()["pods"]["notConfigured"] == ["chat-pod-1"]
        with older.lock:
            older.config = dict(pods.want)
        pods.sync()  # found right once
        cond = _pods_condition(cluster)
        assert cond["status"] == "False" and cond["message"].startswith(
            "chat-pod-1: runs block_size=32"), cond
        pods.sync()
        assert _pods_condition(cluster)["status"] == "True"
        assert cluster.status()["pods"]["notConfigured"] == []
        # Named again, found right once, and the operator restarts (a new memo).
        with older.lock:
            older.config = {**pods.want, "block_size": 32}
        pods.sync()
        with older.lock:
            older.config = dict(pods.want)
        pods.sync()
        pods.memo = kopf.Memo({k: v for k, v in pods.memo.items() if k != MEMO_KEY})
        pods.sync()
        assert cluster.status()["pods"]["notConfigured"] == ["chat-pod-1"]
        pods.sync()
        assert cluster.status()["pods"]["notConfigured"] == []


def test_a_pod_right_for_long_is_named_no_longer_for_having_been_named_before(
        kube: RunningEmulator, cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """The doubling is for a pod that comes back soon after: one that misses a read now
    and then (a slow answer, a restart) starts over at CONFIRM_SYNCS."""
    from slopilot.operator import pod_memory

    monkeypatch.setattr(pod_memory, "CALM_SYNCS", 4)
    pods = Pods(kube, cluster, 1)
    [pod] = pods.standins
    seen: list[bool] = []
    with serving(pod):
        pods.add()
        for wrong in "W RR RRRR W RR".replace(" ", ""):
            with pod.lock:
                pod.config = {**pods.want, "block_size": 32} if wrong == "W" \
                    else dict(pods.want)
            pods.sync()
            seen.append(cluster.status()["pods"]["notConfigured"] == ["chat-pod-0"])
    assert seen == [True, True, False, False, False, False, False, True, True, False]


def test_an_image_wrong_each_time_it_is_named_no_more_is_named_ever_longer() -> None:
    """An image that learns the count: right while named, wrong at the first sync after.
    Each comeback doubles the syncs in a row it must be found right on, up to 32: the
    condition is then written twice in 33 syncs (half an hour), not twice in 3."""
    memory, named, needs, changes = PodMemory(), frozenset[str](), [], 0
    for _ in range(200):
        right = "p" in named
        stay = memory.confirm([("uid-p", "p", right)], named)
        if "p" in stay and stay["p"] not in needs[-1:]:
            needs.append(stay["p"])
        now = frozenset({"p"}) if not right or "p" in stay else frozenset()
        changes, named = changes + (now != named), now
    assert needs == [2, 4, 8, 16, 32]
    assert changes == 19  # named and named no more: with CONFIRM_SYNCS alone, 133


def answers(pod: PodStandIn, path: str, document: dict[str, Any]) -> None:
    """``pod`` answers ``document`` at its next GET of ``path``."""
    with pod.lock:
        if path == "/admin/config":
            pod.config = dict(document)
        else:
            pod.slo = dict(document)


def lies_about(pod: PodStandIn, path: str, lie: dict[str, Any]) -> None:
    """``pod`` takes every PUT of ``path`` (2xx) and answers each GET of it with ``lie``."""
    def lie_on_get(method: str, asked: str) -> None:
        if (method, asked) == ("GET", path):
            answers(pod, path, lie)

    pod.on_request = lie_on_get


def sent(pod: PodStandIn, path: str) -> int:
    with pod.lock:
        return len(pod.puts if path == "/admin/config" else pod.slo_puts)


def restart(cluster: Cluster, pod: str, count: int) -> None:
    """The kubelet's record of the engine container's ``count``-th restart."""
    cluster.kube.patch("v1", "pods", "default", pod, {"status": {"containerStatuses": [
        {"name": "engine", "restartCount": count, "ready": True, "image": "x",
         "imageID": "", "state": {"running": {}}}]}}, subresource="status")


@pytest.mark.parametrize("path", ["/admin/config", "/admin/slo"])
def test_a_pod_that_answers_other_than_it_took_is_named_and_not_sent_it_again(
        kube: RunningEmulator, cluster: Cluster, path: str) -> None:
    """A pod that takes each PUT and answers the next GET with something else was sent
    the same PUT at every sync, once a minute, and counted as brought over each time.
    It is named, and not sent that again until the spec or the pod changes."""
    pods = Pods(kube, cluster, 2)
    honest, liar = pods.standins
    lie = {**pods.want, "token_budget": 512} if path == "/admin/config" \
        else {**pods.slo, "profile": "relaxed"}
    lies_about(liar, path, lie)
    with serving(*pods.standins):
        pods.add()
        pods.sync()
        assert sent(liar, path) == 1
        cond = _pods_condition(cluster)
        assert cond is not None and cond["status"] == "False", cond
        assert cond["message"].startswith(f"chat-pod-1: answers GET {path} with other")
        assert "not sent again until the spec or the pod changes" in cond["message"]
        assert cluster.status()["pods"]["notConfigured"] == ["chat-pod-1"]
        writes = _status_writes(kube)
        for _ in range(3):
            pods.sync()
        assert sent(liar, path) == 1
        assert _status_writes(kube) == writes and _pods_condition(cluster) == cond
        assert (honest.puts, honest.slo_puts) == ([], [])
        # An edit of the spec is sent to it again (and found out again).
        cluster.patch("chat", {"spec": {"engine": {"maxNumSeqs": 64}}})
        pods.sync()
        assert sent(liar, path) == 2
        pods.sync()
        assert sent(liar, path) == 2


def reverts(pod: PodStandIn, path: str, stale: dict[str, Any]) -> None:
    """``pod`` takes every PUT of ``path`` (2xx), answers the read right after it with
    what it took, and ``stale`` at every read after that, as if it never took it."""
    took = threading.Event()

    def revert(method: str, asked: str) -> None:
        if asked != path:
            return
        if method == "PUT":
            took.set()
        elif took.is_set():
            took.clear()  # the sync's read-back: it answers what it took
        else:
            answers(pod, path, stale)

    pod.on_request = revert


@pytest.mark.parametrize("path", ["/admin/config", "/admin/slo"])
def test_a_pod_that_reverts_what_it_took_by_the_next_sync_is_held_not_sent_it_each_time(
        kube: RunningEmulator, cluster: Cluster, path: str) -> None:
    """A pod that answers the read after a PUT with what it took, and the next sync's
    first read with something else again, was sent the same PUT at every sync (each a
    live reconfiguration of the engine) and counted as brought over each time. An
    engine answers what it took until it restarts: it is held as one that contradicts
    its PUT at once is."""
    pods = Pods(kube, cluster, 1)
    [pod] = pods.standins
    stale = {**pods.want, "token_budget": 512} if path == "/admin/config" \
        else {**pods.slo, "profile": "relaxed"}
    reverts(pod, path, stale)
    with serving(pod):
        pods.add()
        pods.sync()
        assert sent(pod, path) == 1
        assert _pods_condition(cluster)["status"] == "True"
        for _ in range(4):
            pods.sync()
        assert sent(pod, path) == 1
        cond = _pods_condition(cluster)
        assert cond["status"] == "False", cond
        assert cond["message"].startswith(f"chat-pod-0: answers GET {path} with other"), cond
        assert [h["pod"] for h in cluster.status()["pods"]["held"]] == ["chat-pod-0"]
        # Once it restarts it runs its ConfigMap's config, and is sent the spec's again.
        restart(cluster, "chat-pod-0", 1)
        pods.sync()
        assert sent(pod, path) == 2


def test_the_operators_own_put_between_two_syncs_is_no_contradiction(
        kube: RunningEmulator, cluster: Cluster) -> None:
    """A trial's knobs sent to the canary between two syncs (``apply_config``) are not
    the pod reverting what the first sync sent it."""
    body, policy, mint = reconciled(kube, cluster, llmd(tuning={"enabled": False}))
    want = spec_config(cluster)
    slo = parse_spec(cluster.get()).slo.to_dict()
    pod = PodStandIn(mint.for_body(cluster.get()), {**want, "token_budget": 512}, slo)
    # A canary needs another ready pod beside it, which runs the spec's config already.
    other = PodStandIn(mint.for_body(cluster.get()), dict(want), slo)
    with serving(pod, other):
        add_pod(cluster, "chat", 0, pod.port)
        add_pod(cluster, "chat", 1, other.port)
        handle = handle_of(cluster, body, policy, mint)
        assert handle.sync_config().updated == ("chat-pod-0",)
        assert handle.apply_config({"token_budget": 2048}, canary=True) == "chat-pod-0"
        done = handle.sync_config()  # as after a trial whose restore was lost
    assert done.updated == ("chat-pod-0",) and done.held == () and done.left == ()
    assert sent(pod, "/admin/config") == 3


def _one_pod_lying_about_its_knobs(kube: RunningEmulator,
                                   cluster: Cluster) -> tuple[Pods, PodStandIn]:
    """One pod that takes every PUT of its knobs and answers token_budget=512 to each
    read (``lies_about``)."""
    pods = Pods(kube, cluster, 1)
    [pod] = pods.standins
    lies_about(pod, "/admin/config", {**pods.want, "token_budget": 512})
    return pods, pod


def test_a_pod_held_back_that_restarts_is_sent_its_config_at_the_next_sync(
        kube: RunningEmulator, cluster: Cluster) -> None:
    """A restarted engine runs its ConfigMap's config, not what it was sent: holding back
    a pod until it changes must not hold back one that restarted."""
    pods, pod = _one_pod_lying_about_its_knobs(kube, cluster)
    with serving(pod):
        pods.add()
        pods.sync()
        pods.sync()
        assert sent(pod, "/admin/config") == 1
        restart(cluster, "chat-pod-0", 1)  # and now it is an honest engine again
        pod.on_request = None
        with pod.lock:
            pod.config = {**pods.want, "token_budget": 512}  # its ConfigMap's, say
        pods.sync()
        assert sent(pod, "/admin/config") == 2 and pod.config == pods.want
        assert cluster.status()["pods"] == {"notConfigured": ["chat-pod-0"], "held": []}
        pods.sync()  # named until a second sync in a row finds it right (pod_memory.py)
        assert sent(pod, "/admin/config") == 2
    cond = _pods_condition(cluster)
    assert cond is not None and cond["status"] == "True", cond
    assert cluster.status()["pods"] == {"notConfigured": [], "held": []}


def test_an_honest_pod_that_restarts_gets_its_config_again_every_time(
        kube: RunningEmulator, cluster: Cluster) -> None:
    pods = Pods(kube, cluster, 1)
    [pod] = pods.standins
    stale = {**pods.want, "token_budget": 512}  # what its ConfigMap said when it started
    with serving(pod):
        pods.add()
        for restarts in range(3):
            restart(cluster, "chat-pod-0", restarts)
            with pod.lock:
                pod.config = dict(stale)
            pods.sync()
            assert pod.config == pods.want
        pods.sync()  # and nothing more once it runs it
        assert sent(pod, "/admin/config") == 3
        # Not even a restart the kubelet has not reported yet is held back.
        with pod.lock:
            pod.config = dict(stale)
        pods.sync()
        assert sent(pod, "/admin/config") == 4 and pod.config == pods.want
    assert _pods_condition(cluster)["status"] == "True"


def test_the_daemons_sync_holds_such_a_pod_back_too(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With tuning on the daemon syncs, on a handle that lives as long as it does: the
    hold is the CR's status, which the timer's syncs (a handle each) and a restarted
    operator read alike."""
    body, _, mint = reconciled(kube, cluster, llmd(prometheus={"url": prom.url},
                                                   tuning={"window": "1h"}))
    want, slo = spec_config(cluster), parse_spec(cluster.get()).slo.to_dict()
    liar = PodStandIn(mint.for_body(cluster.get()), want, slo)
    lies_about(liar, "/admin/config", {**want, "token_budget": 512})
    clock = Clock()
    with serving(liar):
        add_pod(cluster, "chat", 0, liar.port)
        for _ in range(3):
            loop = daemon_loop(cluster, body, monkeypatch)  # an operator restart, each
            loop.clock = clock
            assert loop.step()
            clock.now += CONFIG_SYNC_S
            assert loop.step()
    assert sent(liar, "/admin/config") == 1
    assert cluster.status()["pods"]["notConfigured"] == ["chat-pod-0"]


def test_a_held_pod_that_fails_a_read_in_between_stays_held(
        kube: RunningEmulator, cluster: Cluster) -> None:
    """A sync that could not read the pod cannot tell it came round: dropped then, the
    hold of a pod that failed every other read had it sent the PUT every other sync (and
    the status written at each)."""
    pods, liar = _one_pod_lying_about_its_knobs(kube, cluster)
    with serving(liar):
        pods.add()
        pods.sync()
        held = cluster.status()["pods"]
        writes = _status_writes(kube)
        for _ in range(2):
            with liar.lock:
                liar.raw_gets["/admin/config"] = (500, "application/json", b"{}")
            pods.sync()
            with liar.lock:
                del liar.raw_gets["/admin/config"]
            pods.sync()
        assert sent(liar, "/admin/config") == 1
    assert cluster.status()["pods"] == held and held["held"][0]["pod"] == "chat-pod-0"
    # Named all along: the message it was first written with stands.
    assert _status_writes(kube) == writes


def test_a_held_pod_ready_and_not_by_turns_stays_held(
        kube: RunningEmulator, cluster: Cluster) -> None:
    """A hold is the status's as the pods named are: dropped while its pod was not
    ready, it had the pod sent the PUT again at each sync that found it ready."""
    pods = Pods(kube, cluster, 2)
    liar = pods.standins[1]
    lies_about(liar, "/admin/config", {**pods.want, "token_budget": 512})
    with serving(*pods.standins):
        pods.add()
        pods.sync()
        recorded = cluster.status()["pods"]
        writes = cr_status_writes(kube)
        for turn in range(10):
            set_ready(cluster, "chat-pod-1", turn % 2 == 1)
            pods.sync()
        assert sent(liar, "/admin/config") == 1
    assert cluster.status()["pods"] == recorded and recorded["held"][0]["pod"] == "chat-pod-1"
    assert cr_status_writes(kube) == writes


@pytest.mark.parametrize("pods", [["held"], "held", 7, {"held": {"pod": "x"}},
                                  {"held": [None, 3, {"pod": 1}]}])
def test_holds_that_are_none_of_ours_are_no_holds(pods: Any) -> None:
    """status.pods is the operator's, but whoever may write the status subresource (an
    older release, a tenant granted it) can leave anything there: read as no holds, not
    an AttributeError at every sync."""
    from slopilot.operator.pod_holds import holds_of

    assert holds_of({"status": {"pods": pods}}) == frozenset()
    assert holds_of({"status": "x"}) == frozenset()
