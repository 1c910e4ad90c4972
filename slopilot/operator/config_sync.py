"""``ConfigSyncer``: every ready pod's live knobs and SLO brought to the spec.

``sync_config`` brings every ready pod's live knobs to the spec's config (``spec.engine``
with the committed ``tunedConfig``), which the engine otherwise reads only from its
ConfigMap at start: an edit of a live knob reaches the running pods, and a pod that read
an older ConfigMap is brought over. The pod a running trial measures gets the trial's
knobs over it instead, as ``apply_config`` sent them. A pod that is not ready is not
asked; where the status names it (``PodsConfigured``), it stays named, its holds and
what the syncs remember of it kept, until a sync finds it ready and right.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from slopilot.engine.config import ConfigError, EngineConfig
from slopilot.operator import pod_admin
from slopilot.operator.pod_admin import (
    CONFIG_PATH,
    SLO_PATH,
    ApplyError,
    PodAdmin,
    admin_url,
    ready,
)
from slopilot.operator.pod_holds import Hold, hold_for, holds_of
from slopilot.operator.pod_memory import PodMemory, named_of
from slopilot.operator.spec import LLMDeploymentSpec

log = logging.getLogger(__name__)


class _NotTaken(ApplyError):
    """A pod took a document (PUT) and answers another (GET): held back (pod_holds.py)."""

    def __init__(self, hold: Hold, what: str) -> None:
        super().__init__(f"{hold.pod}: answers GET {hold.path} with {what} than it took "
                         "by PUT; not sent again until the spec or the pod changes (an "
                         "edit, an engine restart, a replacement)")
        self.hold = hold


def _quoted(value: Any) -> str:
    """A value a pod answered, as a log line or a status condition may quote it: the
    image is the tenant's, and its answer may be 64 KiB of anything."""
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "..."


@dataclasses.dataclass(frozen=True)
class ConfigSync:
    """What one ``sync_config`` did: the pods it reconfigured, and ``"<pod>: <why>"`` for
    each one it could not read or bring over (its knobs or its SLO)."""

    updated: tuple[str, ...] = ()
    left: tuple[str, ...] = ()
    slo_updated: tuple[str, ...] = ()
    """The pods sent ``spec.slo`` to judge requests by (``PUT /admin/slo``)."""
    pods: int | None = None
    """The ready pods checked; None where the backend has no live config (vLLM)."""
    not_configured: tuple[str, ...] = ()
    """The pods ``left``, ``confirming`` and ``resting`` name, each once, by name."""
    held: tuple[Hold, ...] = ()
    """The pods not sent a document they took and contradicted (pod_holds.py)."""
    confirming: tuple[str, ...] = ()
    """``"<pod>: <why>"`` for each pod found right that stays named in PodsConfigured
    until more syncs in a row find it so (pod_memory.py)."""
    resting: tuple[str, ...] = ()
    """``"<pod>: <why>"`` for each pod the status names that is not ready now, so not
    checked, and stays named (pod_memory.py)."""
    not_ready: int = 0
    """The deployment's pods that are there but not ready (not checked)."""


@dataclasses.dataclass(frozen=True, slots=True)
class _PodSync:
    """What a sync did to one pod: ``ConfigSync``'s figures, before they are gathered."""

    name: str
    updated: bool = False
    slo_updated: bool = False
    left: tuple[str, ...] = ()
    held: tuple[Hold, ...] = ()
    seen: tuple[tuple[str, Hold | None], ...] = ()
    """Each path read, with the hold of the document the pod took there (None: none
    sent), for the next sync (pod_memory.py)."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Round:
    """What every pod of one sync is asked with."""

    token: str
    ends: float
    """The clock's reading by which the sync is over (``SYNC_DEADLINE_S``)."""
    generation: int | None
    holds: frozenset[Hold]
    """The holds the CR's status records (``status.pods.held``)."""


class ConfigSyncer:
    """The pods of LLMDeployment ``name``, brought to its spec (module docstring)."""

    def __init__(self, admin: PodAdmin, memory: PodMemory, name: str) -> None:
        self.admin, self.memory, self.name = admin, memory, name

    def sync(self, body: Mapping[str, Any], spec: LLMDeploymentSpec,
             own: list[dict[str, Any]], token: str, *,
             trial: Mapping[str, Any] | None = None,
             trial_on: str | None = None) -> ConfigSync:
        """Bring each ready pod of ``own`` (the pods this deployment's own ReplicaSets
        made, by name) to the built-in engine's ``spec`` (of ``body``): on the pod a
        running ``trial`` measures (``trial_on``; None: every pod) the trial's knobs over
        it, as ``apply_config`` sent them.

        Each pod is read first (``GET /admin/config``), so a pod already right is not
        written; so is the SLO it judges requests by (``/admin/slo``: ``spec.slo``). A pod
        that runs other restart knobs (block size, swap space) is from an
        older pod template: the rollout replaces it, and a live PUT could not change them.
        Up to ``SYNC_FANOUT`` pods at once, all of it within ``SYNC_DEADLINE_S``: the
        pods it has no time left for are in ``left``. A pod sent a document is read
        again, and one that contradicts what it took, then or at the next sync's first
        read (pod_memory.py), is in ``left`` and ``held``, and is not sent it again while
        the hold stands (pod_holds.py). A pod the status names that is found right stays
        named (``confirming``) until enough syncs in a row find it so (pod_memory.py),
        and so does one that is not ready (``resting``), with its holds.
        """
        trial_config = None if trial is None else \
            spec.engine.with_overrides(trial, live_only=True)
        slo = spec.slo.to_dict()
        pods = [p for p in own if ready(p)]
        # Not checked, but not gone either: what the status names of them stays, or an
        # image that fails its readiness probe at every other sync had the status written
        # at every sync (named, named no more, named again).
        resting = [p for p in own if not ready(p)
                   and not p["metadata"].get("deletionTimestamp")]
        # The deadline is pod_admin's, read through it: its requests name the same value.
        round_ = _Round(token, self.admin.clock() + pod_admin.SYNC_DEADLINE_S,
                        body["metadata"].get("generation"), holds_of(body))

        def sync(pod: Mapping[str, Any]) -> _PodSync:
            name = str(pod["metadata"]["name"])
            config = trial_config if trial_config is not None and trial_on in (None, name) \
                else spec.engine
            return self._sync_pod(pod, config, slo, round_)

        done = self._side_by_side(pods, sync)
        return self._gathered(body, pods, resting, done, round_)

    def _side_by_side(self, pods: list[dict[str, Any]],
                      sync: Callable[[Mapping[str, Any]], _PodSync]) -> list[_PodSync]:
        """``sync`` of each pod, in the pods' order, whatever finished first. Pods are
        asked side by side: one whose answers are slow (a wedged engine thread holds a PUT
        until its deadline) holds its own worker, not every pod after it."""
        with ThreadPoolExecutor(max_workers=max(1, min(pod_admin.SYNC_FANOUT, len(pods))),
                                thread_name_prefix=f"sync-{self.name}") as pool:
            return list(pool.map(sync, pods))

    def _gathered(self, body: Mapping[str, Any], pods: list[dict[str, Any]],
                  resting: list[dict[str, Any]], done: list[_PodSync],
                  round_: _Round) -> ConfigSync:
        """What the sync did: ``done`` to the ready ``pods`` (in their order), and which
        of them and of the ``resting`` ones stay named (pod_memory.py)."""
        updated = [d.name for d in done if d.updated]
        slo_updated = [d.name for d in done if d.slo_updated]
        if updated:
            log.info("%s: its config sent to %s", self.name, ", ".join(updated))
        if slo_updated:
            log.info("%s: its SLO sent to %s", self.name, ", ".join(slo_updated))
        stay, kept = self._remembered(body, pods, resting, done)
        confirming = tuple(f"{d.name}: runs what it should again; named until "
                           f"{stay[d.name]} syncs in a row find it so" for d in done
                           if d.name in stay)
        # A hold of a pod not checked stands, as one of a pod that did not answer does.
        kept_uids = {uid for uid, _ in kept}
        # Sorted by pod: the status keeps the lists as given, and two that differ in
        # order alone would be written again.
        held = sorted([*(h for d in done for h in d.held),
                       *(h for h in round_.holds if h.uid in kept_uids)],
                      key=lambda h: (h.pod, h.path))
        named = sorted([*(d.name for d in done if d.left or d.name in stay),
                        *(name for _, name in kept)])
        return ConfigSync(
            updated=tuple(updated), left=tuple(why for d in done for why in d.left),
            slo_updated=tuple(slo_updated), pods=len(pods), not_configured=tuple(named),
            held=tuple(held), confirming=confirming,
            resting=tuple(f"{name}: not ready; named until {stay[name]} syncs in a row "
                          "find it ready and running what it should" for _, name in kept),
            not_ready=len(resting))

    def _remembered(self, body: Mapping[str, Any], pods: list[dict[str, Any]],
                    resting: list[dict[str, Any]], done: list[_PodSync]
                    ) -> tuple[dict[str, int], list[tuple[str, str]]]:
        """The memory told what each pod took (pod_memory.py); the pods that stay named,
        each with the syncs in a row still to find it right, and the ``resting`` ones
        among them (uid, name)."""
        uids = [str(p["metadata"].get("uid")) for p in pods]
        resting_ids = [(str(p["metadata"].get("uid")), str(p["metadata"]["name"]))
                       for p in resting]
        self.memory.remember([*uids, *(uid for uid, _ in resting_ids)],
                             ((uid, path, taken) for uid, d in zip(uids, done, strict=True)
                              for path, taken in d.seen))
        stay = self.memory.confirm([(uid, d.name, not d.left)
                                    for uid, d in zip(uids, done, strict=True)],
                                   named_of(body), resting_ids)
        return stay, [(uid, name) for uid, name in resting_ids if name in stay]

    def _sync_pod(self, pod: Mapping[str, Any], config: EngineConfig, slo: dict[str, Any],
                  round_: _Round) -> _PodSync:
        """Bring one pod to ``config`` and ``slo`` by the round's end, where it runs
        others."""
        name = str(pod["metadata"]["name"])
        token, ends = round_.token, round_.ends
        want = config.to_dict()
        # A hold stands until the pod is found running the document, or something it is
        # keyed by changes: a sync that could not tell (the pod did not answer, the
        # deadline) keeps it, or a pod that fails every other read is sent it again.
        held = {h.path: h for h in (hold_for(pod, round_.generation, CONFIG_PATH, want),
                                    hold_for(pod, round_.generation, SLO_PATH, slo))
                if h in round_.holds}
        seen: dict[str, Hold | None] = {}

        def result(*, updated: bool = False, slo_updated: bool = False,
                   left: tuple[str, ...] = ()) -> _PodSync:
            return _PodSync(name, updated, slo_updated, left, tuple(held.values()),
                            tuple(seen.items()))

        if self.admin.clock() >= ends:  # it waits for the next sync, named meanwhile
            return result(left=(f"{name}: not checked: this sync's "
                                f"{pod_admin.SYNC_DEADLINE_S:g} s "
                                "(SYNC_DEADLINE_S) went to slower pods",))
        try:
            runs = self.admin.get(pod, token, ends=ends)
        except ApplyError as exc:
            return result(left=(str(exc),))
        if not isinstance(runs, dict):
            return result(left=(f"{name}: /admin/config did not answer a JSON object of "
                                "knobs",))
        seen[CONFIG_PATH] = None
        left: list[str] = []
        try:
            slo_updated = self._sync_slo(pod, slo, round_, seen)
            held.pop(SLO_PATH, None)
        except ApplyError as exc:  # the knobs are still brought over
            slo_updated = False
            left.append(str(exc))
            if isinstance(exc, _NotTaken):
                held[SLO_PATH] = exc.hold
        if restart := [f"{k}={_quoted(runs.get(k))}" for k in EngineConfig.restart_knobs()
                       if runs.get(k) != want[k]]:
            left.append(f"{name}: runs {', '.join(restart)}, which only a restart "
                        "changes; the rollout of the new pod template replaces it")
            return result(slo_updated=slo_updated, left=tuple(left))

        def runs_it(answer: Any) -> bool:
            return isinstance(answer, dict) and all(answer.get(k) == v
                                                    for k, v in want.items())

        if runs_it(runs):
            held.pop(CONFIG_PATH, None)
            return result(slo_updated=slo_updated, left=tuple(left))
        try:
            hold = self._unless_held(pod, CONFIG_PATH, want, round_, "other knobs")
            self.admin.put(pod, config, token, ends)
            seen[CONFIG_PATH] = hold
            self._read_back(pod, hold, runs_it, round_, "other knobs")
        except (ApplyError, ConfigError) as exc:
            if isinstance(exc, _NotTaken):
                held[CONFIG_PATH] = exc.hold
            return result(slo_updated=slo_updated, left=(*left, str(exc)))
        held.pop(CONFIG_PATH, None)
        return result(updated=True, slo_updated=slo_updated, left=tuple(left))

    def _sync_slo(self, pod: Mapping[str, Any], slo: dict[str, Any], round_: _Round,
                  seen: dict[str, Hold | None]) -> bool:
        """Send ``slo`` (``spec.slo``) to ``pod`` unless it judges by it already; whether
        it was sent (and in ``seen``, what it took). The engine reads the ConfigMap's
        only at start, as its knobs."""
        token, ends = round_.token, round_.ends
        runs = self.admin.get(pod, token, SLO_PATH, ends=ends)
        seen[SLO_PATH] = None
        if runs == slo:
            return False
        hold = self._unless_held(pod, SLO_PATH, slo, round_, "other objectives")
        name = pod["metadata"]["name"]
        url = admin_url(pod) + SLO_PATH
        status, ctype = self.admin.send(name, url, slo, token, ends)
        if status >= 300:
            try:
                self.admin.refused(name, url, status, ctype)
            except ConfigError as exc:  # a 400: an engine that reads SLOs otherwise
                raise ApplyError(f"{exc} (the SLO at {url})") from None
        seen[SLO_PATH] = hold
        self._read_back(pod, hold, lambda answer: answer == slo, round_, "other objectives")
        return True

    def _unless_held(self, pod: Mapping[str, Any], path: str, document: Any,
                     round_: _Round, what: str) -> Hold:
        """The hold that sending ``document`` to ``path`` would earn, should the pod
        contradict it; _NotTaken, with nothing sent, where that hold stands already, or
        where the pod took the document at the last sync and answers another now
        (pod_memory.py)."""
        hold = hold_for(pod, round_.generation, path, document)
        if hold in round_.holds or self.memory.took(hold):
            raise _NotTaken(hold, what)
        return hold

    def _read_back(self, pod: Mapping[str, Any], hold: Hold, took: Callable[[Any], bool],
                   round_: _Round, what: str) -> None:
        """Read ``hold.path`` again after its PUT was taken; _NotTaken where the pod
        answers other than it took. An engine answers what it took from then on, so an
        answer that is not it, sent again, would be sent at every sync."""
        if not took(self.admin.get(pod, round_.token, hold.path, ends=round_.ends)):
            raise _NotTaken(hold, what)
