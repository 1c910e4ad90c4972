"""Many tuning CRs, or slow ones, hold a bounded number of the operator's threads.

Each tuning daemon ran its steps on a thread of its own: a tenant who created thousands
of tuning LLMDeployments had the operator make thousands of threads, and one whose pods
or Prometheus answered slowly held a thread per CR. The daemons now step on the
operator's one pool (tuning_pool.py), a namespace on a share of it.

The daemons run here as kopf runs them, on one event loop, each on a stand-in of
``DeploymentLoop`` whose steps block until the test lets them go (a Prometheus that
answers slowly), so the threads they hold are counted without a cluster or a clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import threading
import types
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import kopf
import pytest
from kopf._cogs.aiokits.aioenums import AsyncFlagWaiter, FlagSetter

from slopilot.operator import tuning_daemon
from slopilot.operator.daemon_ends import DaemonEnds
from slopilot.operator.pod_sync_pool import PodSyncPool
from slopilot.operator.tuning_pool import TuningPool
from tests.operator.test_tuning_pool import YIELDS, Gate, ended, on_loop
from tests.support.waits import HANG_GUARD_S

Reason = kopf.DaemonStoppingReason


class StandInLoop:
    """A CR's loop as the daemon drives it: what ran, and whether two calls overlapped."""

    def __init__(self, name: str, gate: Gate | None) -> None:
        self.name, self.gate = name, gate
        self.calls: list[str] = []
        self.inside = 0
        self.overlapped = False

    def _enter(self, call: str) -> None:
        self.overlapped = self.overlapped or self.inside > 0
        self.inside += 1
        self.calls.append(call)

    def step(self) -> bool:
        self._enter("step")
        try:
            if self.gate is not None:
                self.gate()
        finally:
            self.inside -= 1
        return True

    def _call(self, call: str) -> None:
        self._enter(call)
        self.inside -= 1

    def end_deleted(self) -> None:
        self._call("end_deleted")

    def abandon(self, reason: str, *, restore: bool = False) -> None:
        self._call("abandon")

    def retire(self) -> None:
        self._call("retire")

    def flush(self) -> None:
        self._call("flush")

    def close(self) -> None:
        self._call("close")


class Daemons:
    """Tuning daemons run as kopf runs them, on a pool the test sizes."""

    def __init__(self, pool: TuningPool, monkeypatch: pytest.MonkeyPatch) -> None:
        self.memo = types.SimpleNamespace(kube=None, tokens=None, policy=None, locks=None,
                                          tuning_pool=pool, tuning_daemons=DaemonEnds())
        self.loops: dict[str, StandInLoop] = {}
        self.stops: dict[str, FlagSetter[Reason]] = {}
        self.gates: dict[str, Gate] = {}
        monkeypatch.setattr(tuning_daemon, "DeploymentLoop", self._loop)
        monkeypatch.setattr(tuning_daemon, "load_factory", lambda: None)
        monkeypatch.setenv("SLOPILOT_CONTROLLER_TICK_S", "3600")  # one step, then a pause

    def _loop(self, kube: object, namespace: str, name: str, uid: str,
              **_: object) -> StandInLoop:
        made = self.loops[f"{namespace}/{name}"] = StandInLoop(name, self.gates.get(namespace))
        return made

    def start(self, namespace: str, name: str) -> asyncio.Task[None]:
        setter: FlagSetter[Reason] = FlagSetter()
        self.stops[f"{namespace}/{name}"] = setter
        daemon: Any = tuning_daemon.run_controller  # kopf's type: every kwarg it passes
        return asyncio.create_task(daemon(
            AsyncFlagWaiter(setter), name=name, namespace=namespace, uid=f"uid-{name}",
            memo=self.memo, logger=logging.getLogger("test")))

    def stop(self, key: str, reason: Reason = Reason.OPERATOR_EXITING) -> None:
        self.stops[key].set(reason)

    @contextlib.contextmanager
    def ending(self) -> Iterator[None]:
        """Every daemon told to stop and every gate opened when the block ends, however
        it ends: a failed assertion leaves no step waiting out the hang guard."""
        try:
            yield
        finally:
            for key, setter in self.stops.items():
                if not setter.is_set():
                    self.stop(key)
            for gate in self.gates.values():
                gate.opened.set()


def tuning_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("tuning-")}


def run(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(main())


def test_fifty_slow_crs_of_a_namespace_hold_its_share_and_another_namespace_steps(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Fifty of team-a's CRs, their Prometheus answering slowly: fifty threads before,
    each waiting. Now team-a's steps hold its share of the pool, the others wait for a
    slot on no thread, and team-b's CR is stepped meanwhile."""
    async def main() -> None:
        pool = TuningPool(threads=4, per_namespace=2)
        daemons = Daemons(pool, monkeypatch)
        slow = daemons.gates["team-a"] = Gate()
        fast = daemons.gates["team-b"] = Gate()
        fast.opened.set()
        before = tuning_threads()
        tasks = [daemons.start("team-a", f"chat-{i}") for i in range(50)]
        with daemons.ending():
            await slow.entry()
            await slow.entry()
            tasks.append(daemons.start("team-b", "chat"))
            await fast.entry()  # team-b's step, on a slot team-a left
            held = tuning_threads() - before
            assert len(held) <= 4, f"{len(held)} threads for the daemons' steps"
            assert slow.runs == 2 and pool.waiting() == 48
        await ended(*tasks)
        assert [t.exception() for t in tasks] == [None] * len(tasks)
        ran = [loop for key, loop in daemons.loops.items() if key.startswith("team-a/")]
        # The stop reached the waiting daemons before any slot did: no step of theirs
        # (their end: a decision not on record written, none here, and the heartbeat).
        assert sorted(len(loop.calls) for loop in ran) == [2] * 48 + [3] * 2
        assert all(loop.calls[-1] == "close" for loop in ran)
        pool.shutdown()

    run(main)


@pytest.mark.parametrize(("stop", "ending"), [
    ("deleted", ["end_deleted", "retire", "close"]),
    ("operator stopping", ["flush", "close"])])
def test_a_daemon_stopped_while_it_waits_for_a_slot_ends_without_its_step(
        monkeypatch: pytest.MonkeyPatch, stop: str, ending: list[str]) -> None:
    """Its CR deleted while it waited: the trial is still ended (as at any deletion),
    after no step. A daemon kopf starts while it shuts down is never told to stop
    (commands.py): ``OPERATOR_STOPPING`` ends its wait as well."""
    monkeypatch.setattr(tuning_daemon, "OPERATOR_STOPPING", threading.Event())

    async def main() -> None:
        pool = TuningPool(threads=1, per_namespace=1)
        daemons = Daemons(pool, monkeypatch)
        slow = daemons.gates["team-a"] = Gate()
        holder = daemons.start("team-a", "chat")
        with daemons.ending():
            await slow.entry()
            waiting = daemons.start("team-b", "chat")
            await on_loop(lambda: pool.waiting() == 1,
                          "team-b's daemon waiting for a slot, on no thread")
            if stop == "deleted":
                daemons.stop("team-b/chat", Reason.RESOURCE_DELETED)
            else:
                tuning_daemon.OPERATOR_STOPPING.set()
            slow.opened.set()
            await ended(waiting)
            assert waiting.exception() is None
            assert daemons.loops["team-b/chat"].calls == ending
        await ended(holder)
        assert daemons.loops["team-a/chat"].calls == ["step", "flush", "close"]
        pool.shutdown()

    run(main)


@pytest.mark.parametrize("reason", [Reason.RESOURCE_DELETED, Reason.FILTERS_MISMATCH,
                                    Reason.OPERATOR_EXITING],
                         ids=lambda r: r.name.lower())
def test_a_cancelled_daemons_ending_waits_for_its_step_on_the_thread(
        monkeypatch: pytest.MonkeyPatch, reason: Reason) -> None:
    """kopf cancels a daemon that has not stopped in time, mid-step; the step goes on on
    its thread. The trial's end, the metrics' and the heartbeat's run after it, not
    beside it on another of the pool's threads."""
    async def main() -> None:
        pool = TuningPool(threads=4, per_namespace=4)
        daemons = Daemons(pool, monkeypatch)
        slow = daemons.gates["team-a"] = Gate()
        task = daemons.start("team-a", "chat")
        with daemons.ending():
            await slow.entry()
            daemons.stop("team-a/chat", reason)
            task.cancel()
            for _ in range(YIELDS):
                await asyncio.sleep(0)
            loop = daemons.loops["team-a/chat"]
            assert loop.calls == ["step"] and pool.running() == 1
        await ended(task)
        assert task.cancelled()
        ending = {Reason.RESOURCE_DELETED: ["end_deleted", "retire"],
                  Reason.FILTERS_MISMATCH: ["abandon", "retire"]}.get(reason, ["flush"])
        assert loop.calls == ["step", *ending, "close"] and not loop.overlapped
        pool.shutdown()

    run(main)


def test_deletions_whose_storage_hangs_hold_their_namespaces_share_not_kopfs_threads(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A CR deleted while tuning is off has its study deleted by the deletion handler.
    With the shared database silent, each call waited out its connect timeout on one of
    kopf's handler threads: a tenant deleting many CRs held them all from every other
    tenant's reconciles. The deletion is a tuning-pool call now, in its namespace's share."""
    from slopilot.operator import handlers

    handler: Any = handlers.delete_deleted_studies  # kopf's type: every kwarg it passes
    # A sync handler is run on kopf's handler threads, whatever it waits on.
    assert asyncio.iscoroutinefunction(handler), "the deletion runs on kopf's threads"

    async def main() -> None:
        pool = TuningPool(threads=4, per_namespace=2)
        silent, answering = Gate(), Gate()
        answering.opened.set()
        deleted: list[str] = []

        def delete_studies(body: dict[str, Any], policy: object, **_: object) -> None:
            namespace = body["metadata"]["namespace"]
            (silent if namespace == "team-a" else answering)()
            deleted.append(f"{namespace}/{body['metadata']['name']}")

        monkeypatch.setattr(handlers, "delete_studies", delete_studies)
        memo = types.SimpleNamespace(policy=None, tuning_pool=pool, pod_syncs=PodSyncPool(),
                                     tuning_daemons=DaemonEnds())

        def deletion(namespace: str, name: str) -> asyncio.Task[None]:
            body = {"metadata": {"namespace": namespace, "name": name, "uid": name}}
            return asyncio.create_task(handler(body=body, memo=memo,
                                               logger=logging.getLogger("test"),
                                               runtime=datetime.timedelta(0)))

        try:
            team_a = [deletion("team-a", f"chat-{i}") for i in range(10)]
            await silent.entry()
            await silent.entry()
            await on_loop(lambda: pool.waiting() == 8, "team-a's other deletions waiting")
            assert pool.running() == 2 and silent.inside == 2
            await asyncio.wait_for(deletion("team-b", "chat"), HANG_GUARD_S)
            assert deleted == ["team-b/chat"]
        finally:
            silent.opened.set()
        await asyncio.wait_for(asyncio.gather(*team_a), HANG_GUARD_S)
        assert len(deleted) == 11 and silent.runs == 10
        pool.shutdown()

    run(main)


@pytest.mark.parametrize(("reason", "ending"), [
    (Reason.RESOURCE_DELETED, ["end_deleted", "retire", "close"]),
    (Reason.OPERATOR_PAUSING, ["flush", "close"])], ids=["deleted", "paused"])
def test_the_deletion_handler_deletes_the_study_only_once_the_crs_daemon_has_ended(
        monkeypatch: pytest.MonkeyPatch, reason: Reason, ending: list[str]) -> None:
    """The handler deletes a tuning CR's study too: deleted while no operator ran, the CR
    has no daemon whose end would. Where one runs, the handler waits for its end (the
    trial failed, the study deleted): beside it, it deleted the study under the trial
    being failed, or under the step measuring it. A daemon that ended without the
    deletion (this replica paused: kopf stops daemons before the deletion handler runs)
    leaves it to the handler. Waited for too long, the handler asks kopf to call it
    again, whose cycle cancels a daemon that does not stop."""
    from slopilot.operator import handlers

    handler: Any = handlers.delete_deleted_studies  # kopf's type: every kwarg it passes

    async def main() -> None:
        pool = TuningPool(threads=4, per_namespace=4)
        daemons = Daemons(pool, monkeypatch)
        slow = daemons.gates["team-a"] = Gate()
        deletions: list[list[str]] = []

        def delete_studies(*_: object, **__: object) -> None:
            deletions.append(list(daemons.loops["team-a/chat"].calls))

        monkeypatch.setattr(handlers, "delete_studies", delete_studies)
        memo = types.SimpleNamespace(policy=None, tuning_pool=pool, pod_syncs=PodSyncPool(),
                                     tuning_daemons=daemons.memo.tuning_daemons)
        body = {"metadata": {"namespace": "team-a", "name": "chat", "uid": "uid-chat"}}

        def deletion() -> asyncio.Task[None]:
            return asyncio.create_task(handler(body=body, memo=memo,
                                               logger=logging.getLogger("test"),
                                               runtime=datetime.timedelta(0)))

        task = daemons.start("team-a", "chat")
        with daemons.ending():
            await slow.entry()  # a step on its thread
            daemons.stop("team-a/chat", reason)
            monkeypatch.setattr(handlers, "DAEMON_END_WAIT_S", 0.0)
            with pytest.raises(kopf.TemporaryError):
                await deletion()
            monkeypatch.setattr(handlers, "DAEMON_END_WAIT_S", HANG_GUARD_S)
            waiting = deletion()
            for _ in range(YIELDS):
                await asyncio.sleep(0)
            assert deletions == [] and not waiting.done()
            slow.opened.set()
            await ended(task, waiting)
        assert waiting.exception() is None
        assert deletions == [["step", *ending]]
        assert len(daemons.memo.tuning_daemons) == 0
        pool.shutdown()

    run(main)


def test_a_daemon_end_that_never_finishes_holds_the_deletion_for_a_bounded_time(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A step stuck on its thread (a storage query waiting on a lock: the heartbeat sets
    only a connect timeout) keeps its daemon's end from finishing, after kopf cancelled
    the daemon and let it go. The handler asked kopf to call it again every cycle, and
    the CR stayed Terminating for ever. Past ``DAEMON_END_GIVE_UP_S`` since it first ran
    (kopf's ``runtime``) it deletes the study anyway, with one warning naming the daemon."""
    from slopilot.operator import handlers

    handler: Any = handlers.delete_deleted_studies  # kopf's type: every kwarg it passes
    monkeypatch.setattr(handlers, "DAEMON_END_WAIT_S", 0.0)
    give_up = 120.0  # DAEMON_END_GIVE_UP_S, as operations.md states it

    async def main() -> None:
        pool = TuningPool(threads=4, per_namespace=4)
        daemons = Daemons(pool, monkeypatch)
        stuck = daemons.gates["team-a"] = Gate()
        deletions: list[str] = []
        monkeypatch.setattr(handlers, "delete_studies",
                            lambda body, *_, **__: deletions.append(body["metadata"]["uid"]))
        memo = types.SimpleNamespace(policy=None, tuning_pool=pool, pod_syncs=PodSyncPool(),
                                     tuning_daemons=daemons.memo.tuning_daemons)
        body = {"metadata": {"namespace": "team-a", "name": "chat", "uid": "uid-chat"}}

        async def deletion(runtime_s: float) -> None:
            await handler(body=body, memo=memo, logger=logging.getLogger("test"),
                          runtime=datetime.timedelta(seconds=runtime_s))

        task = daemons.start("team-a", "chat")
        with daemons.ending():
            await stuck.entry()
            daemons.stop("team-a/chat", Reason.RESOURCE_DELETED)
            task.cancel()  # kopf's escalation; the step goes on on its thread
            with caplog.at_level(logging.DEBUG, logger="test"):
                for runtime_s in (0.0, 10.0, give_up - 1):
                    with pytest.raises(kopf.TemporaryError) as again:
                        await deletion(runtime_s)
                    # kopf logs and posts each as an ERROR: a few in the bound, no more.
                    assert again.value.delay == handlers.DAEMON_END_RETRY_S >= 15
                assert deletions == []
                await deletion(give_up)
            assert deletions == ["uid-chat"]
            lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "test"]
            assert [level for level, _ in lines] == [logging.WARNING], lines
            assert "tuning daemon" in lines[0][1] and "120" in lines[0][1]
            assert len(daemons.memo.tuning_daemons) == 1  # its end still stuck
            assert getattr(handlers, "DAEMON_END_GIVE_UP_S", None) == give_up
        await ended(task)
        await on_loop(lambda: len(daemons.memo.tuning_daemons) == 0, "the daemon's end")
        pool.shutdown()

    run(main)
