"""What a ``slopilot tune`` study's trials were run under, recorded on the study and
checked when ``--storage`` resumes it.

A stored study is found by its name alone, and its completed trials are ranked with the
new run's: trials simulated on 4 replicas were recommended "on 1 replica", where they
missed the SLO by 2.5-8x. So the study records, when made, everything that decides a
trial's value (the scenario's contents, not its name or path; the replicas; the windows;
the fixed knobs; the space; the cost profile; the objective), and a resume under
anything else is refused, naming what differs. A study without the record that has
completed trials (an older slopilot's, or not made by ``tune``) is refused too: nobody
knows what its trials were run under. One with none is adopted.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Mapping
from enum import Enum
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from slopilot import __version__
from slopilot.engine.sim.workload_spec import TraceSpec, WorkloadSpec
from slopilot.tuner.sim.robust import WindowPlan
from slopilot.tuner.study.bounds import Bound, Choice
from slopilot.tuner.study.objective import HEADROOM, OBJECTIVE_VERSION
from slopilot.tuner.study.storage_url import redacted, shown
from slopilot.tuner.tune.settings import TuneSettings, tune_command

RECORD_ATTR = "slopilot_tune_record"
"""The study user attribute that holds the record."""
RECORD_FORM = 1
"""The record's own layout; another layout is read as another record."""


class StudyMismatch(ValueError):
    """The stored study was run under other settings; the message names them and the fix."""


def trial_settings(s: TuneSettings, plan: WindowPlan) -> dict[str, Any]:
    """Each thing that decides a trial's value, by the name a message gives it: short
    values as themselves (a dict is compared key by key), large ones as a digest."""
    sc = s.scenario
    memory = "" if sc.gpu_memory_utilization is None else \
        f", gpu_memory_utilization {_num(sc.gpu_memory_utilization)}"
    profile = "datasheet" if sc.profile is None else \
        f"calibrated {sc.profile.name} {_digest(_without(_plain(sc.profile), 'source'))}"
    return {
        "hardware": f"{sc.num_gpus} x {sc.gpu} (tp {sc.tp}), {sc.model}{memory}",
        "cost profile": profile,
        "dispatch": sc.dispatch.value,
        "engine knobs": {k: _plain(v) for k, v in sorted(sc.engine.items())},
        "workload": _digest(_workload(sc.workload)),
        "SLO": _flat(sc.slo.to_dict()),
        "replicas": s.replicas,
        "windows": "; ".join(
            f"{w.name}: {_num(w.start_s)}-{_num(w.end_s)} s (+{_num(w.warmup_s)} s "
            f"warm-up, +{_num(w.drain_s)} s drain)" for w in plan.windows),
        "fixed knobs (--set)": {k: _plain(s.start.config[k]) for k in sorted(s.fixed)},
        "search space (--bound, --set)": {
            **{k: _bound(b) for k, b in sorted(s.space.bounds.items())},
            "budget_align": s.space.budget_align},
        "objective": (f"v{OBJECTIVE_VERSION}: goodput, every SLO term at most "
                      f"{1 - HEADROOM:.0%} of its limit in every window"),
    }


def check_or_record(study: optuna.Study, s: TuneSettings, plan: WindowPlan) -> str | None:
    """Record this run's settings on a study that has none and no completed trial;
    refuse (StudyMismatch) one whose record differs or that has trials and no record.
    Returns a warning where the study was made by another slopilot version (its twin may
    have simulated the same settings otherwise), else None."""
    now = trial_settings(s, plan)
    stored = study.user_attrs.get(RECORD_ATTR)
    where = "in memory" if s.storage is None else f"in {shown(s.storage)}"
    fix = (f"give another --study-name (e.g. {study.study_name}-2) or --storage for a "
           "new study")
    if not isinstance(stored, Mapping) or stored.get("form") != RECORD_FORM:
        done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if done:
            drop = f"optuna delete-study --storage {shown(s.storage or '')} --study-name " \
                   f"{study.study_name}"
            raise StudyMismatch(
                f"study {study.study_name!r} {where} has {len(done)} completed trials but "
                "records no settings they were run under (made by an older slopilot, or "
                "not by slopilot tune), so they cannot be ranked against this run's: "
                f"{fix}, or delete it to run it afresh ({drop})")
        command = tune_command(s) if s.storage is None else redacted(tune_command(s),
                                                                     s.storage)
        study.set_user_attr(RECORD_ATTR, {"form": RECORD_FORM, "settings": now,
                                          "made_by": __version__, "command": command})
        return None
    then = dict(stored.get("settings") or {}) \
        if isinstance(stored.get("settings"), Mapping) else {}
    command = str(stored.get("command"))
    if "dispatch" not in then:
        # Recorded before the twin had a policy, when every arrival went to the
        # least-loaded replica: what its trials were run under, and its command cannot
        # say so.
        then["dispatch"] = "least_requests"
        command += " --dispatch least_requests"
    differ = _differences(then, now)
    if differ:
        raise StudyMismatch(
            f"study {study.study_name!r} {where} was run under other settings, and its "
            f"trials would be ranked as if run under these: {'; '.join(differ)}. Resume it "
            f"with the settings it was made with ({command}), or {fix}")
    made_by = stored.get("made_by")
    if made_by != __version__:
        return (f"study {study.study_name!r} was made by slopilot {made_by}, this is "
                f"{__version__}: its earlier trials were simulated by that version's twin, "
                "which may judge the same config otherwise")
    return None


def _differences(then: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """One line per setting that differs, in the record's order: a dict's keys that
    differ, or the whole value."""
    out = []
    for name in [*now, *(k for k in then if k not in now)]:
        old, new = then.get(name), now.get(name)
        if old == new:
            continue
        if isinstance(old, Mapping) and isinstance(new, Mapping):
            keys = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
            out.append(f"{name}: " + ", ".join(
                f"{k} {_shown(old.get(k))} then, {_shown(new.get(k))} now" for k in keys))
        else:
            out.append(f"{name}: {_shown(old)} then, {_shown(new)} now")
    return out


def _shown(value: Any) -> str:
    if value is None:
        return "unset"
    return value if isinstance(value, str) else json.dumps(value)


def _num(x: float) -> str:
    """Exact (``repr`` round-trips a double), and whole numbers without their ``.0``."""
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else repr(float(x))


def _bound(b: Bound) -> str:
    if isinstance(b, Choice):
        return "|".join(str(getattr(o, "value", o)) for o in b.options)
    return f"{_num(b.lo)}..{_num(b.hi)}{' log' if b.log else ''}"


def _flat(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"classes": {"p0": {"ttft_p99_ms": 300}}}`` as ``{"p0.ttft_p99_ms": 300}``, its
    unset terms left out: one line names the term that changed."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}" if k != "classes" else prefix
        if isinstance(v, Mapping):
            out.update(_flat(v, key + ("." if key else "")))
        elif v is not None:
            out[key] = _plain(v)
    return out


def _workload(spec: WorkloadSpec) -> Any:
    """The workload's contents; a trace's by the requests it replays, not its path (the
    file may be rewritten in place, or the same one named otherwise)."""
    if not isinstance(spec, TraceSpec):
        return _plain(spec)
    h = hashlib.sha256()
    for r in spec.records():
        h.update(repr(tuple(_plain(getattr(r, f.name)) for f in dataclasses.fields(r)))
                 .encode())
    return {**_without(_plain(spec), "trace"), "records": h.hexdigest()}


def _without(d: Any, key: str) -> Any:
    return {k: v for k, v in d.items() if k != key} if isinstance(d, dict) else d


def _plain(x: Any) -> Any:
    """``x`` as JSON data, the same for equal values in any process (a digest's input):
    a dataclass as its type and fields, an enum as its value, arrays as lists."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {"type": type(x).__name__,
                **{f.name: _plain(getattr(x, f.name)) for f in dataclasses.fields(x)}}
    if isinstance(x, Enum):
        return _plain(x.value)
    if isinstance(x, Mapping):
        return {str(_plain(k)): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, (set, frozenset)):
        return sorted((_plain(v) for v in x), key=repr)
    if isinstance(x, float):
        return x if math.isfinite(x) else repr(x)
    if x is None or isinstance(x, (bool, int, str)):
        return x
    if isinstance(x, Path):
        return str(x)
    if hasattr(x, "tolist"):  # numpy arrays and scalars
        return _plain(x.tolist())
    return repr(x)


def _digest(data: Any) -> str:
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]
