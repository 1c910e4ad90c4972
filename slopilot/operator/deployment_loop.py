"""One LLMDeployment's tuning loop, which its daemon (tuning_daemon.py) steps.

Each step (``DeploymentLoop.step``): read the object fresh, ``tick(now)`` the controller
(at most one action), then write ``status`` (phase, replicas, config, bestTrial, trials,
lastAction, the ``Tuning`` condition) and the controller's whole loop state in
``status.controller``, and post an event for every action. Once a window, the
deployment's measured P99s and SLO attainment go to ``status`` too (slo_status.py).

- Resumable: a restarted operator builds the controller from the persisted state, so a
  scale or a trial already done is resumed (cooling down, or measuring the running
  trial), not done again. A scale whose status write failed before the operator
  stopped is not on record: the Deployment's stamp (scale_stamp.py) has the restarted
  loop read the count from before it, so that its scale to the same count is a no-op.
  Each controller's study beats for the trial it holds open; a
  controller replaced (a new spec generation) or dropped, and the daemon's at its end,
  stops beating (``close``), after its successor, if any, has taken the trial over.
- Idempotent: a status write that fails leaves the controller as it is in memory, and
  the next step writes that same state again before it ticks; a daemon never asks a
  second trial because its first was not recorded. The daemon keeps this loop across
  steps the API server fails (tuning_daemon.py), and at an end that leaves the trial to
  be resumed writes it once more (``flush``). A status that takes no write at all (an
  admission webhook on ``llmdeployments/status`` failing every PATCH) is said on the CR
  (a ``StatusUnwritable`` Warning event, posted explicitly: the events API takes writes
  still, and kopf does not post the CR's logger's lines) and counted
  (``slopilot_status_write_failures_total``). The loop does not tick meanwhile, but the
  pods' sync goes on (it writes nothing of the decision held): an edit or a drifted pod
  is brought to the spec, and a canary to the trial this loop runs. After
  ``STATUS_GIVE_UP_S`` of failed writes the trial on the pods is ended, told failed in
  its study (``status_unwritable``) and the episode's config, rebased on the spec as it
  is now, sent back to the pods (the sync then keeps them off the trial's; on vLLM, its
  Deployment's arguments, stamped so that no reconcile renders the trial's record again:
  vllm_take_back.py, taken back again at each step while the status takes no write, as
  the stamp is a tenant's to remove; the write that next takes reduces that record to
  its committed config), and a restarted operator that finds it still on record does not
  resume it (``trial_ends.end_told``), and, on vLLM, takes its arguments off again while
  the status still takes no write (``_recognise_taken_back``: a restart, or a key rotated
  with it, loses the old process's memory and the stamp's seal, not the loop state).
  ``STATUS_GIVE_UP_S`` is shortened to the trial's window where that is shorter
  (``give_up_after``).
- One writer of the loop's state: each write of ``status.controller`` is made only over
  the state this daemon built its controller from or last wrote there. Another found
  there is another writer's (a second operator replica's daemon, before the peering
  paused one, or an administrator's reset): this daemon's tick is dropped, its own trial
  told failed, and its next step resumes the state on record. Each wrote over the other's
  before: two trials RUNNING in the study, each daemon's config on the pods.
- Deleted: the study's running trial is told FAIL, so that it does not stay RUNNING,
  then the study is deleted from every storage it lived in (``status.studyStorages``,
  which each step's status write keeps: study_cleanup.py): it is keyed by the CR's uid,
  so a new CR of the same name starts its own and nothing would ever resume it. Tuning turned off
  ends the episode (the running trial failed, the loop to STEADY: turned on again, it
  waits for an alert) and keeps the study, for when it is turned on again.
- Pods on the spec's config: at each new spec generation (whether or not a controller
  could be built for it) and every ``CONFIG_SYNC_S`` after it, the pods are brought to
  the spec's live knobs, and the pod a
  running trial measures to the trial's (``KubeDeploymentHandle.sync_config``): the
  engine reads its ConfigMap only at start, so an edit of a live knob, a pod that read an
  older ConfigMap, or a canary restarted mid-trial would otherwise run a config that
  neither the status nor the controller knows.
- No trial unwatched: where no controller can be built (the study's storage unreadable,
  a spec or a policy the operator refuses), the trial on record is ended, its config
  taken off the pods, and told failed in its study by the next build, never judged on a
  window that watched nothing (``_unbuilt``, trial_ends.py); under a refused spec, which
  the sync does not touch, only that owed config goes to the pods (``_take_back``; on
  vLLM, to its Deployment's arguments: vllm_take_back.py).

The controller comes from controller_build.py, the status it writes from loop_status.py.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from slopilot.operator.conditions import ConditionType, condition, merge_conditions, now_rfc3339
from slopilot.operator.controller_build import build
from slopilot.operator.crd import API_VERSION, PLURAL
from slopilot.operator.daemon import ControllerFactory, operator_metrics
from slopilot.operator.decision_events import post_decision, post_status_unwritable
from slopilot.operator.knobs import committed_record, trial_recorded, tuned_on
from slopilot.operator.kube_handle import KubeDeploymentHandle
from slopilot.operator.kubeapi import Kube
from slopilot.operator.loop_status import on_record, rebase_episode, status_after
from slopilot.operator.merge_patch import replacing
from slopilot.operator.pod_admin import ApplyError
from slopilot.operator.pod_memory import PodMemory
from slopilot.operator.pods_status import record_pods_condition
from slopilot.operator.policy import OperatorPolicy, policy_problems
from slopilot.operator.reconcile import not_reconciled
from slopilot.operator.scrape_status import ScrapeCheck, scrape_event
from slopilot.operator.slo_status import WindowFigures
from slopilot.operator.spec import Backend, SpecError, parse_spec
from slopilot.operator.status_writer import write_status
from slopilot.operator.study_cleanup import delete_studies
from slopilot.operator.tokens import TokenMint
from slopilot.operator.trial_ends import (
    UNREADABLE_KEPT,
    UNWRITTEN,
    end_unbuilt,
    trial_storage,
    unreadable,
)
from slopilot.operator.tuned_base import target_of
from slopilot.operator.tuned_status import NotHeld
from slopilot.operator.twin_status import TwinTracker
from slopilot.operator.vllm_take_back import stamp_found
from slopilot.tuner.loop.controller import Controller
from slopilot.tuner.loop.decision import Decision
from slopilot.tuner.loop.errors import ControllerError
from slopilot.tuner.loop.state import ControllerState, LoopState, RunningTrial
from slopilot.tuner.study.study_target import StudyTarget

log = logging.getLogger(__name__)
Clock = Callable[[], float]

CONFIG_SYNC_S = 60.0
"""How often the pods' configs are checked against the spec between builds: a pod that
read an older ConfigMap (it started before an edit and became ready after its sync) runs
the old config at most this long."""

STATUS_GIVE_UP_S = 300.0
"""The longest the loop's status writes may fail in a row (an admission webhook on
``llmdeployments/status`` that fails every PATCH, an etcd that refuses writes) before it
ends the trial on the pods (``give_up_after``): until a decision is on record the loop
does not tick (the pods' sync goes on), so that trial served unwatched, never judged nor
rolled back, for as long as the writes failed. Five minutes rides out an API server's
restart."""


def give_up_after(window_s: float) -> float:
    """How long failed status writes are ridden out before the trial on the pods is
    ended, for a trial window of ``window_s``: ``STATUS_GIVE_UP_S``, or one window where
    that is shorter.

    The loop judges a trial by its window's end (one that breaks the SLO badly already
    at its early look, a quarter window in); while the writes fail it judges none. A
    trial left past one window of failed writes serves longer unjudged than the loop
    ever lets one (a one-minute trial served five minutes of them under the fixed
    bound), so a short window bounds the wait. A long one does not stretch it: an hour's
    trial waited out for the status served that hour without its early look, as a
    trial is not left to serve unwatched while Prometheus is down either
    (``Controller._hold``). Counted from the first failed write of the run, on the
    loop's clock; a window under the daemon's tick ends the trial at the first retry
    that fails."""
    return min(STATUS_GIVE_UP_S, window_s)


class DeploymentLoop:
    """One LLMDeployment's controller, stepped by its daemon (see the module docstring)."""

    def __init__(self, kube: Kube, namespace: str, name: str, uid: str, *, mint: TokenMint,
                 policy: OperatorPolicy, factory: ControllerFactory, locks: Any,
                 logger: logging.Logger | logging.LoggerAdapter[Any], clock: Clock = time.time,
                 memory: PodMemory | None = None) -> None:
        self.kube, self.namespace, self.name, self.uid = kube, namespace, name, uid
        # Locked per write, not per tick: a tick may take minutes, and every reconcile of
        # this CR would wait that long on one of kopf's few handler threads.
        # A config is recorded only over the loop state this loop last saw (a trial on
        # every replica is rendered from the status, and another daemon's would run
        # under its).
        self.handle = KubeDeploymentHandle(kube, namespace, name, mint=mint, policy=policy,
                                           uid=uid, guard=lambda: locks.hold(self.key),
                                           memory=memory, holds=self._holds,
                                           record=lambda: self.on_record)
        self.policy, self.factory, self.locks = policy, factory, locks
        self.logger, self.clock = logger, clock
        self.controller: Controller | None = None
        self.built_for: int | None = None
        self.storage: str | None = None
        """The storage the CR names (``OperatorPolicy.named_storage``) as the
        controller's study was opened in it."""
        self.unwritten: Decision | None = None
        """A decision whose status write failed: written again before the next tick."""
        self.unwritten_time = ""
        self.unwritten_since: float | None = None
        """When the status writes began to fail in a row (``give_up_after``)."""
        self.unwritten_error = ""
        self.taken_back: Any = None
        """The trial's ``status.tunedConfig`` record whose config the status-unwritable
        end took off a vLLM Deployment (``_end_unrecorded_trial``): the write that next
        takes reduces it to its committed record in the same patch, or a reconcile
        between the loop's state and the record rendered the trial again."""
        self.taken_back_to: tuple[dict[str, Any], str] | None = None
        """The whole config and the backend that end sent (``taken_back``): sent again at
        each step the status still takes no write (``_keep_taken_back``)."""
        self.figures: WindowFigures | None = None
        self.scrapes: ScrapeCheck | None = None
        self.twin = TwinTracker(kube, namespace, name, clock)
        self.synced_at: float | None = None
        """When the pods were last brought to the spec's config; None: at the next step."""
        self.synced_for: int | None = None
        """The spec generation they were brought to then."""
        self.on_record: Any = None
        """``status.controller`` as this loop's controller was built from it or last wrote
        it (``on_record``): another state found there is another writer's (module
        docstring), which this loop resumes rather than overwrites."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def _holds(self, body: Mapping[str, Any]) -> bool:
        """Whether ``status.controller`` in ``body`` is still the state this loop last
        built from or wrote."""
        return on_record((body.get("status") or {}).get("controller")) == self.on_record

    def _named_storage(self, body: Mapping[str, Any]) -> str:
        return self.policy.named_storage(parse_spec(body).tuning.storage, self.namespace)

    def _ours(self, body: Mapping[str, Any] | None) -> bool:
        return (body is not None and not body["metadata"].get("deletionTimestamp")
                and str(body["metadata"].get("uid")) == self.uid)

    def step(self) -> bool:
        """One tick and its status; False once the object is gone (the daemon ends)."""
        body = self.handle.kube.get(*_CR, self.namespace, self.name)
        if not self._ours(body):
            return False
        assert body is not None
        generation = body["metadata"].get("generation")
        if self.unwritten is not None:  # no new tick before the last one is on record
            if not self._write(self.unwritten, self.unwritten_time):
                self._recognise_taken_back(body)
                self._keep_taken_back(body)
                self._end_unrecorded_trial()
                # The sync writes nothing of the decision held: the pods follow the spec,
                # the canary the trial this controller runs (until it is given up),
                # however long the writes fail. Left out, a restarted canary served the
                # spec's config, measured as the trial's, and an edit or a drifted pod
                # waited the outage out. Only on a failed write: this state was the one
                # on record as it was tried (another's is found, not failed: _overtaken).
                self._sync_pods(body, generation)
            return True
        saved = (body.get("status") or {}).get("controller")
        if self.controller is not None and on_record(saved) != self.on_record:
            self._overtaken(saved, "its state in status.controller was replaced")
        try:
            if self.controller is None or self.built_for != generation or \
                    self.twin.moved():
                twin = self.twin.resolve(parse_spec(body), generation)
                replaced = self.controller
                self.controller = build(self.kube, self.handle, body, self.factory,
                                        self.policy, twin)
                self.on_record = on_record(saved)
                self.storage = self._named_storage(body)
                # After the build, which resumed the trial: the new study beats already
                # (unless a factory hands both controllers one study: it is kept then).
                if replaced is not None and replaced.study is not self.controller.study:
                    replaced.study.close()
                self.built_for = generation
                self.twin.write(twin, generation, self._ours)
                self.figures = WindowFigures(self.controller.evaluator,
                                             self.controller.settings.window_s, self.clock())
                self.scrapes = ScrapeCheck(self.controller.evaluator,
                                           self.controller.settings.window_s, self.clock())
            # The clock too: what an apply starts (a trial's window, a cooldown) counts
            # from its return, which may be minutes into the tick.
            decision = self.controller.tick(self.clock(), clock=self.clock)
            if not self._write(decision, now_rfc3339()):
                # A restarted loop's first tick: a take-back its predecessor made is
                # kept from this step, not the next one's (_recognise_taken_back).
                self._recognise_taken_back(body)
                self._keep_taken_back(body)
        except (SpecError, ControllerError) as exc:
            self.close()  # rebuilt once the spec or the environment is fixed
            self.logger.warning("controller not running: %s", exc)
            body = self._unbuilt(body, str(exc), generation)
        self._sync_pods(body, generation)
        self._measure()
        self._check_scrapes(generation)
        return True

    def _unbuilt(self, body: dict[str, Any], why: str, generation: int | None
                 ) -> dict[str, Any]:
        """No controller could be built (``why``): the ``Tuning`` condition says so, and
        a trial on record is ended, its config owed back to the pods (``end_unbuilt``),
        in one write over the state this step read. The object to sync the pods from."""
        saved = (body.get("status") or {}).get("controller")
        ended = end_unbuilt(saved, why, trial_storage(body.get("status")), self.clock())
        if ended is None:
            # A trial this build's failure ended at an earlier step is still said: the
            # condition is rewritten each step, and the spec's error alone hid it.
            if unreadable(saved) and self._accepted(body):
                why = f"{why}; {UNREADABLE_KEPT}"
            self._write_condition(_with_ended(why, saved), generation)
            return body
        assert ended.ended_trial is not None
        message = _with_ended(why, ended.to_dict())
        mine, basis = ended.to_dict(), on_record(saved)

        def build_status(fresh: dict[str, Any]) -> dict[str, Any] | None:
            status = fresh.get("status") or {}
            if not self._ours(fresh) or on_record(status.get("controller")) != basis:
                return None  # another writer's state now: its trial is its own
            return {"controller": replacing(mine, status.get("controller")),
                    "conditions": merge_conditions(status.get("conditions"), [condition(
                        ConditionType.TUNING, False, "ControllerUnavailable", message,
                        generation)])}

        try:
            written = write_status(self.kube, self.namespace, self.name, build_status)
        except Exception as exc:  # the API: the trial is ended at the next step
            log.warning("%s: trial %d not ended (%s: %s)", self.key,
                        ended.ended_trial.number, type(exc).__name__, exc)
            return body
        if written is None or on_record(
                (written.get("status") or {}).get("controller")) != on_record(mine):
            self._write_condition(why, generation)
            return body if written is None else written
        log.warning("%s: %s", self.key, message)
        self.on_record = on_record(mine)
        self.synced_at = None  # the pods off the trial's config now
        return written

    def _sync_pods(self, body: Mapping[str, Any], generation: int | None) -> None:
        """After the tick, so that a trial it started is kept on its pod (module
        docstring); at a new generation, else once a ``CONFIG_SYNC_S``."""
        now = self.clock()
        # A clock stepped back (an NTP step) makes the time since negative: due now, or
        # the pods went unchecked for the step's length.
        if generation == self.synced_for and self.synced_at is not None \
                and 0 <= now - self.synced_at < CONFIG_SYNC_S:
            return
        known, trial, basis = self._running_trial(body)
        if not known:
            self._take_back(body, now, generation)
            return
        if trial is not None and trial.canary and trial.canary_replica is None:
            return  # a canary not on record: which pod runs the trial is not known
        self.synced_at, self.synced_for = now, generation
        try:
            done = self.handle.sync_config(
                trial=None if trial is None else trial.config,
                trial_on=None if trial is None else trial.canary_replica,
                holds=lambda fresh: on_record(
                    (fresh.get("status") or {}).get("controller")) == basis)
        except NotHeld as exc:  # judged on a state since replaced: again at the next step
            self.synced_at = None
            log.warning("%s: the pods' configs were not checked: %s", self.key, exc)
            return
        except Exception as exc:  # the API or the CR went away: tried again when due
            log.warning("%s: the pods' configs were not checked: %s: %s", self.key,
                        type(exc).__name__, exc)
            return
        for why in done.left:
            log.warning("%s: a pod is not on the spec's config: %s", self.key, why)
        record_pods_condition(self.kube, self.namespace, self.name, self.uid, done,
                              generation)

    def _take_back(self, body: Mapping[str, Any], now: float, generation: int | None
                   ) -> None:
        """A spec the reconcile refuses touches the pods only to take a trial's config
        off them: where the state on record owes its episode's config (its trial ended
        with no controller, ``trial_ends.py``, or a rollback's apply failed), that config
        is sent, whole (over the episode's start), once a ``CONFIG_SYNC_S``. It was
        recorded under the last spec the operator accepted, which the pods were made
        from; the refused spec's own knobs and SLO go to no pod."""
        if self.controller is not None:
            return
        saved = (body.get("status") or {}).get("controller")
        try:
            state = LoopState.from_dict(saved) if isinstance(saved, Mapping) else None
        except ControllerError:
            return
        target = None if state is None or state.trial is not None \
            or state.pending_restore is None else state.rollback_config()
        if state is None or target is None:
            return
        self.synced_at, self.synced_for = now, generation
        try:
            sent = self.handle.take_back({**(state.baseline_config or {}), **target},
                                         _ran_on(state, body).backend)
        except Exception as exc:  # tried again when due; the restore stays owed
            log.warning("%s: the episode's config was not put back on the pods under a "
                        "refused spec: %s: %s", self.key, type(exc).__name__, exc)
            return
        if sent:
            log.warning("%s: the spec is refused; the episode's config put back on %s, "
                        "off the trial's", self.key, ", ".join(sent))

    def _running_trial(self, body: Mapping[str, Any]
                       ) -> tuple[bool, RunningTrial | None, Any]:
        """Whether the pods may be synced now, the trial they are to keep, and the loop
        state (``on_record``) that trial was judged from: a sync records a config only
        while that state is still on record. Without a controller (it could not be
        built: the study's database down, say, or another writer's state just found) the
        pods still follow a spec the reconcile accepts, around the trial on record; a
        spec it refuses touches nothing, as in the reconcile."""
        if self.controller is not None:
            return True, self.controller.loop.trial, self.on_record
        if not self._accepted(body):
            return False, None, None
        saved = (body.get("status") or {}).get("controller")
        try:
            state = LoopState.from_dict(saved) if isinstance(saved, Mapping) else None
        except ControllerError:
            # A state this version cannot read (another slopilot's, or a hand edit's):
            # no trial it records is watched, so none is kept on the pods, which go
            # back to the committed config. Kept, the trial's config served unwatched
            # until someone reset the state.
            return True, None, on_record(saved)
        return True, None if state is None else state.trial, on_record(saved)

    def _accepted(self, body: Mapping[str, Any]) -> bool:
        """Whether the reconcile accepts the spec in ``body`` (the pods may follow it)."""
        try:
            spec = parse_spec(body)
        except SpecError:
            return False
        return not (policy_problems(spec, self.policy, namespace=self.namespace)
                    or not_reconciled(self.kube, body, spec))

    def _ready(self, controller: Controller) -> int | None:
        """The replicas ready now, for ``status.readyReplicas`` (``replicas`` is the
        count asked: after a scale a quota refused, 6 beside the 3 that serve); None
        where they cannot be read now (the status keeps the last count)."""
        try:
            return controller.deployment.replica_counts().ready
        except Exception as exc:  # an API error: the tick's own write still goes out
            log.warning("%s: ready replicas not read (%s: %s)", self.key,
                        type(exc).__name__, exc)
            return None

    def _write(self, decision: Decision, action_time: str) -> bool:
        """Write the controller's state as of ``decision``; on failure keep it for later.
        Only over the state on record as this loop last saw it: another writer's state
        found there (another operator replica's daemon) is resumed, not overwritten, and
        this tick's decision dropped (``_overtaken``)."""
        controller = self.controller
        assert controller is not None
        self.unwritten, self.unwritten_time = decision, action_time
        mine = controller.to_dict()
        found: list[Any] = []
        ready = self._ready(controller)

        def build_status(fresh: dict[str, Any]) -> dict[str, Any] | None:
            if not self._ours(fresh):
                return None
            now = on_record((fresh.get("status") or {}).get("controller"))
            if now != self.on_record:
                found.append(now)
                return None
            status = status_after(fresh, controller, decision, action_time, self.storage,
                                  ready)
            tuned = (fresh.get("status") or {}).get("tunedConfig")
            if self.taken_back is not None and tuned == self.taken_back:
                reduced = committed_record(tuned)
                status["tunedConfig"] = None if reduced is None else replacing(reduced, tuned)
            return status

        try:
            written = write_status(self.kube, self.namespace, self.name, build_status)
        except Exception as exc:  # an API error or a dropped connection: retried next step
            log.warning("%s: status write failed (%s: %s); the controller keeps its state "
                        "and writes it again before its next tick", self.key,
                        type(exc).__name__, exc)
            self._unrecorded(exc)
            return False
        self.unwritten, self.taken_back, self.taken_back_to = None, None, None
        if self.unwritten_since is not None:
            self.logger.info("the status is written again after %.0f s of failed writes",
                             self.clock() - self.unwritten_since)
            self.unwritten_since = None
        if found:
            self._overtaken(found[0], "another writer replaced status.controller during "
                            f"the tick ({decision.action.value}: {decision.reason})")
            return True
        self.on_record = on_record(mine)
        if written is not None:
            post_decision(written, decision)
        return True

    def _unrecorded(self, exc: Exception) -> None:
        """A status write failed: counted, and said on the CR at the first failure of a
        run (``_say``)."""
        operator_metrics(self.namespace).status_write_failed(self.name)
        self.unwritten_error = f"{type(exc).__name__}: {exc}"
        if self.unwritten_since is not None:
            return
        self.unwritten_since = self.clock()
        self._say(
            f"the status write failed ({self.unwritten_error}); the loop holds its "
            "decision and does not tick until it is on record (the pods are still kept on "
            f"the spec's config), and a trial on the pods is ended after "
            f"{self._give_up_s():g} s of failed writes")

    def _say(self, message: str) -> None:
        """``message`` on the CR's logger (the operator's log) and as a Warning event on
        the CR (``post_status_unwritable``: kopf does not post the logger's lines). An
        event not posted is the log's alone: the loop goes on."""
        self.logger.warning("%s", message)
        try:
            post_status_unwritable(self.namespace, self.name, self.uid, message)
        except Exception:
            log.exception("%s: the status write's failure was not posted as an event",
                          self.key)

    def _give_up_s(self) -> float:
        """``give_up_after`` this loop's trial window."""
        controller = self.controller
        return STATUS_GIVE_UP_S if controller is None \
            else give_up_after(controller.settings.window_s)

    def _end_unrecorded_trial(self) -> None:
        """Status writes have failed for ``give_up_after`` the trial's window: the trial
        on the pods is ended as tuning turned off ends it (``Controller.stop``: told
        failed in its study, the loop to STEADY), and the episode's config put back on
        every pod (``_episode_config``). The state held for the write says so once the
        status takes it; a restarted operator that finds the trial still on record finds
        it failed in its study, and ends it there (``trial_ends.end_told``)."""
        controller, since = self.controller, self.unwritten_since
        if controller is None or since is None:
            return
        loop, now = controller.loop, self.clock()
        if now < since:  # a clock stepped back: counted from now, not after the step's length
            self.unwritten_since = since = now
        trial = loop.trial
        if trial is None or now - since < self._give_up_s():
            return
        reason = (f"{UNWRITTEN}: trial {trial.number} ended: the status took no write for "
                  f"{now - since:.0f} s ({self.unwritten_error}); its config was taken "
                  "off the pods")
        whole, backend, body = self._episode_config(controller)
        controller.stop(now, reason)
        if whole is not None:
            if backend == Backend.VLLM.value and trial_recorded(body):
                # Held before the patch: one the API refuses is made again at each step
                # (_keep_taken_back), as no sync puts a vLLM Deployment's arguments back.
                self.taken_back = (body.get("status") or {}).get("tunedConfig")
                self.taken_back_to = whole, backend
            # Sent, not recorded: apply_config records status.tunedConfig first, which
            # the status refuses as it refuses the loop's writes.
            try:
                self.handle.take_back(whole, backend)
            except Exception:  # the sync (on vLLM, _keep_taken_back) tries again
                log.exception("%s: could not put the episode's config back after trial %d",
                              self.key, trial.number)
        self.synced_at = None  # the pods checked against the trial's end at once
        self._say(reason)

    def _recognise_taken_back(self, body: Mapping[str, Any]) -> None:
        """A take-back made by an earlier process of this operator (restarted while the
        status took no write), recognised from what outlives it: ``body``'s record of a
        vLLM trial, and the loop state built from that status owing the episode's config
        with no trial running (the trial was ended, told failed in its study:
        ``trial_ends.end_told``, which makes that restore owed), or, where no restore is
        owed, the Deployment's stamp (present, verified or not: a key rotated since
        leaves it unverified). An owed restore needs no stamp: the old process may have
        died between telling the study and its take-back's patch (or the API refused
        that patch), and the trial's arguments then stayed on every pod, unwatched, for
        the rest of the outage. Held as ``_end_unrecorded_trial`` holds its own, so that
        ``_keep_taken_back`` keeps the trial's arguments off the pods, stamped under the
        key held now, and the write that next takes reduces the record
        (vllm_take_back.py)."""
        controller = self.controller
        if self.taken_back is not None or controller is None or not trial_recorded(body):
            return
        loop = controller.loop
        target = None if loop.trial is not None else loop.rollback_config()
        if target is None or _ran_on(loop, body).backend != Backend.VLLM.value:
            return
        try:
            if loop.pending_restore is None \
                    and not stamp_found(self.kube, self.namespace, self.name, self.uid):
                return
        except Exception as exc:  # the API: recognised at the next step
            log.warning("%s: the Deployment's take-back stamp was not read: %s: %s",
                        self.key, type(exc).__name__, exc)
            return
        self.taken_back = (body.get("status") or {}).get("tunedConfig")
        self.taken_back_to = {**(loop.baseline_config or {}), **target}, Backend.VLLM.value
        log.warning("%s: the status still records a trial this operator ended before "
                    "it restarted (its study told it failed, or a take-back stamp is on "
                    "the Deployment); its arguments kept off until the status takes a "
                    "write", self.key)

    def _keep_taken_back(self, body: Mapping[str, Any]) -> None:
        """While the status still takes no write and records the trial whose vLLM
        arguments ``_end_unrecorded_trial`` took back (``body``, the CR as this step read
        it), that take-back is made again: its stamp is an annotation on the tenant's
        Deployment, which anyone with patch rights there removes, and a drift repair then
        rendered the trial's record again, on pods no trial watches. No patch where the
        arguments and the stamp are still as sent (vllm_take_back.py)."""
        sent = self.taken_back_to
        if sent is None or (body.get("status") or {}).get("tunedConfig") != self.taken_back:
            return
        try:
            rolled = self.handle.take_back(*sent)
        except Exception as exc:  # tried again at the next step
            log.warning("%s: the ended trial's vLLM arguments were not checked: %s: %s",
                        self.key, type(exc).__name__, exc)
            return
        if rolled:
            log.warning("%s: the ended trial's vLLM arguments were back on %s (its "
                        "take-back stamp removed or no longer valid); taken off again",
                        self.key, ", ".join(rolled))

    def _episode_config(self, controller: Controller
                        ) -> tuple[dict[str, Any] | None, str, Mapping[str, Any]]:
        """The whole config a trial given up leaves every pod on (the episode's best,
        else its start), the backend the pods run and the CR as read. Rebased first on
        the spec as it is now (``rebase_episode``, as ``abandon`` does): the pods follow
        an edit made during the outage (the sync), and the episode's start from before
        it, sent whole, undid it on every pod. No config where the CR cannot be read, or
        a switch of backend or model ended the episode: its trial is told failed in its
        own study, and the switch's rollout replaced what the pods ran."""
        loop = controller.loop
        try:
            body = self.handle.body()
            ran_on = _ran_on(loop, body)  # before the rebase stamps the spec's target
            switched = rebase_episode(loop, body)
        except (ApplyError, SpecError) as exc:
            log.warning("%s: no config put back after the trial: %s", self.key, exc)
            return None, "", {}
        if switched is not None and switched.trial is not None:
            self._fail_switched(controller, switched.trial.number, switched.reason)
            return None, "", {}
        target = loop.rollback_config()
        if target is None:
            return None, "", body
        return {**(loop.baseline_config or {}), **target}, ran_on.backend, body

    def _overtaken(self, theirs: Any, why: str) -> None:
        """Another writer's state ``theirs`` is on record (another operator replica's
        daemon acts on this CR, or an administrator reset it): this loop's controller is
        dropped and the next step builds one from the status, resuming the trial on
        record, if any. Its own trial, unless it is that one, is told failed: left
        running, it was a second trial the study held open beside the other's, its config
        on the pods until the sync put them back (at the next step)."""
        controller = self.controller
        if controller is None:
            return
        recorded = theirs.get("trial") if isinstance(theirs, Mapping) else None
        number = recorded.get("number") if isinstance(recorded, Mapping) else None
        trial = controller.loop.trial
        if trial is not None and trial.number != number:
            try:
                controller.study.tell_failed(
                    trial.number, "another operator replica's state for this "
                    "LLMDeployment was on record: its trial, if any, goes on instead")
            except Exception:  # left RUNNING, it goes stale once nothing beats for it
                log.exception("%s: could not fail trial %d", self.key, trial.number)
        log.warning("%s: %s; this replica's controller is dropped and the state on record "
                    "resumed", self.key, why)
        self.close()
        self.synced_at = None  # the pods back to the config on record at the next step

    def _write_condition(self, message: str, generation: int | None) -> None:
        try:
            write_status(self.kube, self.namespace, self.name, lambda fresh: {
                "conditions": merge_conditions(
                    (fresh.get("status") or {}).get("conditions"),
                    [condition(ConditionType.TUNING, False, "ControllerUnavailable",
                               message, generation)])} if self._ours(fresh) else None)
        except Exception:
            log.exception("%s: could not write the Tuning condition", self.key)

    def _measure(self) -> None:
        figures = self.figures
        if figures is None or self.controller is None:
            return
        fields = figures.due(self.clock())
        if not fields:
            return
        try:
            write_status(self.kube, self.namespace, self.name,
                         lambda fresh: dict(fields) if self._ours(fresh) else None)
        except Exception:
            log.exception("%s: could not write the measured figures", self.key)

    def _check_scrapes(self, generation: int | None) -> None:
        """The ``ScrapeInterval`` condition, once a window (scrape_status.py); an event
        when it turns False."""
        if self.scrapes is None or self.controller is None:
            return
        try:
            said = self.scrapes.due(self.clock())
        except Exception:  # a check's fault never stops the loop: read again a window on
            log.exception("%s: the scrape interval was not read", self.key)
            return
        if said is None:
            return
        said["observedGeneration"] = generation
        was: list[Any] = []  # the status it had, once the write is judged ours

        def build(fresh: dict[str, Any]) -> dict[str, Any] | None:
            was.clear()
            if not self._ours(fresh):
                return None
            conditions = (fresh.get("status") or {}).get("conditions")
            was.append(next((c.get("status") for c in conditions or ()
                             if c.get("type") == said["type"]), None))
            return {"conditions": merge_conditions(conditions, [said])}

        try:
            written = write_status(self.kube, self.namespace, self.name, build)
        except Exception:
            log.exception("%s: could not write the ScrapeInterval condition", self.key)
            return
        if said["status"] == "False":
            log.warning("%s: %s", self.key, said["message"])
            if written is not None and was and was[0] != "False":
                scrape_event(written, said)

    def retire(self) -> None:
        """This CR's controller series leave the operator's /metrics: the CR is gone, or
        no longer tuned. Not when a successor of the same name is already there: the
        series are labelled by namespace and name, so they are the successor's now."""
        try:
            body = self.kube.get(*_CR, self.namespace, self.name)
        except Exception:  # unknown: forget, a deleted CR's series must not stay forever
            body = None
        if body is not None and str(body["metadata"].get("uid")) != self.uid:
            return
        metrics = self.controller.metrics if self.controller is not None \
            else operator_metrics(self.namespace)
        metrics.forget(self.name)

    def flush(self) -> None:
        """The daemon ends leaving its trial to be resumed (the operator exiting or
        pausing): a decision whose status write failed is written once more, as at a
        step, so that the next operator finds its trial on record and resumes it. Left
        unwritten, that one asked a second trial, and the first went stale on no record."""
        if self.unwritten is not None and self.controller is not None:
            self._write(self.unwritten, self.unwritten_time)

    def close(self) -> None:
        """Drop the controller, and the heartbeat its study holds for its open trials:
        left beating, a dropped controller's thread kept a trial alive that nothing ran.
        A trial still open goes stale unless a controller resumes it in time (the next
        one built here, a restarted operator, the peering's next leader)."""
        controller, self.controller = self.controller, None
        if controller is not None:
            controller.study.close()

    def _controller_to_end(self, *, with_episode: bool) -> Controller | None:
        """The controller whose episode or study the daemon's end closes: the running
        one, or, when the daemon ended before a step built one (the CR was deleted before
        its first step), one built from the CR's body and kept for the next ending.
        None when the CR is gone or a successor's, or (``with_episode``) its status has
        no episode under way (STEADY, no trial, no restore owed)."""
        if self.controller is not None:
            return self.controller
        body = self.kube.get(*_CR, self.namespace, self.name)
        if body is None or str(body["metadata"].get("uid")) != self.uid:
            return None  # gone, or already a new CR of the same name: not ours to touch
        saved = (body.get("status") or {}).get("controller") or {}
        if with_episode and not saved.get("trial") and not saved.get("pending_restore") \
                and saved.get("state", ControllerState.STEADY.value) == ControllerState.STEADY:
            return None  # nothing to end: no reason to build
        try:
            self.controller = build(self.kube, self.handle, body, self.factory, self.policy)
            self.on_record = on_record(saved)
            self.storage = self._named_storage(body)
        except (SpecError, ControllerError) as exc:
            log.warning("%s: cannot reach the study to end it: %s", self.key, exc)
            return None
        return self.controller

    def end_deleted(self) -> None:
        """The CR is deleted: its running trial is failed, then its study deleted."""
        self.abandon("the LLMDeployment was deleted during the trial")
        self.delete_study()

    def delete_study(self) -> None:
        """The deleted CR's study leaves the storage, with all its trials, and every
        other storage it lived in (``status.studyStorages``: spec.tuning.storage was
        switched). Its name holds the CR's uid, so no later CR resumes it, and kept it
        would grow a shared storage by every CR a tenant creates and deletes. Never on
        tuning turned off: the CR may turn it on again and go on with its study."""
        body = self.kube.get(*_CR, self.namespace, self.name)
        controller = self._controller_to_end(with_episode=False)
        if controller is not None:
            try:
                controller.study.delete_study()
            except Exception:  # the database may be down: the study stays (operations.md)
                log.exception("%s: could not delete the deleted LLMDeployment's study",
                              self.key)
            else:
                log.info("%s: the deleted LLMDeployment's study deleted", self.key)
        # Every storage on record, the controller's too: it deleted the one study it
        # tuned in, and the family (a base its space moved on from) may hold more there.
        if body is not None and str(body["metadata"].get("uid")) == self.uid:
            delete_studies(body, self.policy, log=self.logger)

    def _fail_switched(self, controller: Controller, number: int, reason: str) -> None:
        try:
            controller.study.tell_failed(number, reason)
        except Exception:  # left RUNNING, it goes stale once nothing beats for it
            log.exception("%s: could not fail trial %d", self.key, number)

    def abandon(self, reason: str, *, restore: bool = False) -> None:
        """Tuning ends (the CR is being deleted, or tuning was turned off), and the
        episode with it (``Controller.stop``): the open trial is told failed, as a dead
        trial would otherwise stay RUNNING, and the loop goes to STEADY, so tuning turned
        on again waits for an alert. With ``restore``, a trial's end sends every replica
        back to the episode's starting (or best) config. A restore still owed after a
        rollback that failed ends as well (``Controller.stop``): the sync, which runs
        while tuning is off, brings the pods to the committed config."""
        controller = self._controller_to_end(with_episode=True)
        if controller is None:
            return
        loop = controller.loop
        trial = loop.trial
        if trial is None and loop.state is ControllerState.STEADY \
                and loop.pending_restore is None:
            return
        target = None
        if restore and trial is not None:
            # Before the stop, which ends the episode: its best or baseline is the target.
            try:  # the controller may predate an edit that ended tuning (rebase_episode)
                ran_on = rebase_episode(loop, self.handle.body())
                target = loop.rollback_config()
            except (ApplyError, SpecError) as exc:
                log.warning("%s: no config restored after the trial: %s", self.key, exc)
            else:
                if ran_on is not None and ran_on.trial is not None:
                    # A switch ended it, which the stop below no longer sees: this
                    # controller was built on the trial's own study.
                    self._fail_switched(controller, ran_on.trial.number, ran_on.reason)
        controller.stop(self.clock(), reason)
        if target is not None:
            try:
                self.handle.apply_config(target, canary=False)
            except Exception:
                log.exception("%s: could not restore the config after the trial", self.key)
        self.unwritten = None
        try:  # replaced whole, as each step writes it: merged, a map kept the old keys
            write_status(self.kube, self.namespace, self.name, lambda fresh: {
                "controller": replacing(loop.to_dict(),
                                        (fresh.get("status") or {}).get("controller"))}
                if self._ours(fresh) else None)
        except Exception:
            log.exception("%s: could not record the ended episode in status", self.key)


def _with_ended(why: str, saved: Any) -> str:
    """``why`` no controller runs, with the trial ``saved`` (a loop state's dict) keeps
    as ended and not yet told failed, if any."""
    ended = saved.get("ended_trial") if isinstance(saved, Mapping) else None
    number = ended.get("number") if isinstance(ended, Mapping) else None
    if not isinstance(number, int):
        return why
    return (f"{why}; trial {number} ended: its config is taken off the pods, and it is "
            "told failed in its study once a controller is built")


def _ran_on(state: LoopState, body: Mapping[str, Any]) -> StudyTarget:
    """The backend and model the pods run as the operator last accepted the spec: the
    loop state's stamp, else ``status.tunedConfig``'s, else (a status older than both)
    the spec's."""
    if state.target is not None:
        return StudyTarget.from_key(state.target)
    return tuned_on(body) or target_of(body)


_CR = (API_VERSION, PLURAL)
