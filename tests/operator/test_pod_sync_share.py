"""PodSyncShare: a namespace's pod syncs hold a bounded share of kopf's handler threads,
and a sync past it is refused at once, never waited for."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from slopilot.operator.pod_sync_share import (
    HANDLER_THREADS,
    PER_NAMESPACE,
    TOTAL,
    Busy,
    PodSyncShare,
    Refused,
)
from tests.support.waits import HANG_GUARD_S


class Held:
    """A sync that stays under way until ``release`` (a pod answering slowly)."""

    def __init__(self) -> None:
        self.entered, self.released = threading.Event(), threading.Event()
        self.runs = 0

    def __call__(self) -> None:
        self.runs += 1
        self.entered.set()
        assert self.released.wait(HANG_GUARD_S), "never released"


@contextmanager
def under_way(share: PodSyncShare, namespace: str, name: str,
              sync: Held | None = None) -> Iterator[Held]:
    """A sync of ``namespace/name`` holding its slot for the block's length."""
    held = sync or Held()
    result: list[Refused | None] = []
    thread = threading.Thread(target=lambda: result.append(share.run(namespace, name, held)))
    thread.start()
    try:
        assert held.entered.wait(HANG_GUARD_S), "the sync did not start"
        yield held
    finally:
        held.released.set()
        thread.join(HANG_GUARD_S)
    assert result == [None]


def test_the_numbers_leave_threads_to_other_namespaces_and_other_handlers() -> None:
    assert 1 <= PER_NAMESPACE < TOTAL < HANDLER_THREADS
    assert PER_NAMESPACE <= HANDLER_THREADS // 4  # one namespace: a quarter at most


def test_a_namespace_past_its_share_is_refused_at_once_and_others_run() -> None:
    share = PodSyncShare(per_namespace=2, total=3)
    ran: list[str] = []
    with under_way(share, "team-a", "one"), under_way(share, "team-a", "two"):
        refused = share.run("team-a", "three", lambda: ran.append("three"))
        assert refused is not None and refused.busy is Busy.NAMESPACE
        assert "2 syncs of namespace team-a's deployments" in refused.message
        assert share.run("team-b", "chat", lambda: ran.append("b")) is None
    assert ran == ["b"]
    assert share.run("team-a", "three", lambda: ran.append("three")) is None
    assert ran == ["b", "three"] and len(share) == 0


def test_every_namespace_together_is_bounded_too() -> None:
    share = PodSyncShare(per_namespace=1, total=2)
    with under_way(share, "team-a", "chat"), under_way(share, "team-b", "chat"):
        refused = share.run("team-c", "chat", lambda: None)
        assert refused is not None and refused.busy is Busy.OPERATOR
        assert "2 pod syncs at once (TOTAL)" in refused.message


def test_a_crs_second_sync_runs_after_its_first_only_when_asked_again() -> None:
    share = PodSyncShare()
    first = Held()
    with under_way(share, "team-a", "chat", first):
        refused = share.run("team-a", "chat", lambda: None)  # the timer's: nothing to add
        assert refused is not None and refused.busy is Busy.DEPLOYMENT
    assert first.runs == 1
    again = Held()
    with under_way(share, "team-a", "chat", again):
        # A reconcile's, after an edit the sync under way may have read too early: twice
        # asked, one more sync does it.
        for _ in range(2):
            assert share.run("team-a", "chat", lambda: None, again=True) is not None
    assert again.runs == 2 and len(share) == 0


def test_a_sync_that_raises_gives_its_slot_back() -> None:
    share = PodSyncShare(per_namespace=1, total=1)

    def broken() -> None:
        raise RuntimeError("the API went away")

    with pytest.raises(RuntimeError):
        share.run("team-a", "chat", broken)
    assert share.run("team-a", "other", lambda: None) is None and len(share) == 0


@pytest.mark.parametrize(("per_namespace", "total"), [(0, 4), (3, 2)])
def test_a_share_that_lets_nothing_run_or_more_than_all_is_refused(
        per_namespace: int, total: int) -> None:
    with pytest.raises(ValueError, match="expected 1 <= per_namespace <= total"):
        PodSyncShare(per_namespace=per_namespace, total=total)


def test_the_operator_runs_kopfs_handlers_on_that_many_threads() -> None:
    """Unset, kopf's pool was asyncio's default, min(32, CPUs + 4): 6 on a 2-CPU pod, and
    the shares above were sized against no known number."""
    import kopf

    from slopilot.operator.settings import configure

    settings = kopf.OperatorSettings()
    configure(settings)
    assert settings.execution.max_workers == HANDLER_THREADS


def test_the_security_model_states_the_numbers_the_operator_runs_with() -> None:
    from slopilot.operator.deployment_loop import CONFIG_SYNC_S
    from slopilot.operator.handlers import DEFERRED_SYNCS
    from tests.docs.test_doc_references import ROOT

    text = " ".join((ROOT / "docs" / "operations.md").read_text(encoding="utf-8").split())
    for said in (f"one pool of {HANDLER_THREADS} threads (`HANDLER_THREADS`",
                 f"at most {PER_NAMESPACE} of them at once (`PER_NAMESPACE`)",
                 f"at most {TOTAL} (`TOTAL`), which leaves {HANDLER_THREADS - TOTAL} to",
                 f"next interval ({CONFIG_SYNC_S:g} s)",
                 f"once {DEFERRED_SYNCS} syncs of a CR in a row were not run"):
        assert said in text, said
