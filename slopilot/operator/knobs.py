"""An LLMDeployment's engine knobs: where each lives in the CR, its schema, how it is judged.

The CRD's ranges and the handler's checks both come from ``EngineConfig``'s field
metadata, so a range changes in one place (slopilot/engine/config.py) only. Here too:
``spec.engine`` over its preset (``engine_config``), one ``spec.tuning.bounds`` entry
(``bound_problem``), the knobs vLLM has an argument for, the committed tuned config
(``status.tunedConfig``) with the hash of the spec it was tuned from, and ``spec.tuning``
whole (``tuning_section``): its bounds judged, and the trials' range built once with
``slopilot tune``'s own ``SearchSpace.from_bounds`` over the backend's knobs.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from slopilot.engine.config import PRESETS, ConfigError, EngineConfig, coerce_knob
from slopilot.engine.durations import parse_duration
from slopilot.operator.merge_patch import replacing
from slopilot.operator.pod_layout import SCRAPE_INTERVAL_S
from slopilot.operator.spec_reader import SpecReader
from slopilot.operator.study_storage import sqlite_sidecar_problem
from slopilot.operator.tuned_base import (
    base_matches,
    moved_from,
    recorded_target,
    spec_checksum,
    target_of,
)
from slopilot.tuner.loop.settings import (
    DEFAULT_CLASS_REQUESTS,
    DEFAULT_MAX_TRIAL_S,
    MAX_CLASS_REQUESTS,
)
from slopilot.tuner.prometheus.rules import duration
from slopilot.tuner.study.bounds import DEFAULT_BOUNDS, IntRange
from slopilot.tuner.study.space import SearchSpace
from slopilot.tuner.study.study_target import StudyTarget

# spec.engine path (camelCase, as users write it) -> EngineConfig field name.
KNOB_PATHS: dict[tuple[str, ...], str] = {
    ("tokenBudget",): "token_budget",
    ("budgetAlign",): "budget_align",
    ("chunkSize",): "chunk_size",
    ("maxNumSeqs",): "max_num_seqs",
    ("kvWatermark",): "kv_watermark",
    ("blockSize",): "block_size",
    ("swapSpaceGb",): "swap_space_gb",
    ("maxWaiting",): "max_waiting",
    ("enablePrefixCaching",): "enable_prefix_caching",
    ("preemption", "mode"): "preemption_mode",
    ("preemption", "recomputeMaxTokens"): "recompute_max_tokens",
    ("preemption", "maxPerStep"): "max_preemptions_per_step",
    ("preemption", "swapTimeoutMs"): "swap_timeout_ms",
    ("preemption", "p0Utilization"): "p0_preempt_utilization",
}
FIELD_PATHS: dict[str, tuple[str, ...]] = {f: p for p, f in KNOB_PATHS.items()}
# spec.tuning.bounds entry -> EngineConfig field: the knobs a CR may narrow or widen.
BOUNDED_KNOBS = {"tokenBudget": "token_budget", "chunkSize": "chunk_size",
                 "maxNumSeqs": "max_num_seqs"}

# The knobs vLLM has an argument for (``vllm_args``): the tuner's space for a vLLM
# deployment holds only these (``TuningSpec.space``). The rest vLLM lacks; a user who sets
# one is told so in a status condition. (budget_align only rounds the budget passed.)
# Not swap_space_gb: vLLM 0.11 runs only its V1 engine, which preempts by recompute and
# never reads --swap-space (only vllm/config/cache.py's verify_with_parallel_config
# checks it, refusing to start when it exceeds 70 % of the node's memory).
VLLM_APPLIES = frozenset({"token_budget", "chunk_size", "max_num_seqs", "block_size",
                          "enable_prefix_caching"})
VLLM_LACKS = tuple(f.name for f in dataclasses.fields(EngineConfig)
                   if f.name not in VLLM_APPLIES)
# The block sizes vLLM's --block-size takes: vLLM 0.11's vllm/config/cache.py types it
# ``BlockSize = Literal[1, 8, 16, 32, 64, 128]`` and engine/arg_utils.py makes that the
# argparse choices, so any other size exits before the engine starts.
VLLM_BLOCK_SIZES = (1, 8, 16, 32, 64, 128)
# vLLM 0.11's default attention backend on Ampere and Hopper GPUs (FlashAttention, or
# Triton; platforms/cuda.py) needs a multiple of this (v1/attention/backends/
# flash_attn.py: "Block size must be a multiple of 16."); Blackwell's FlashInfer does not.
VLLM_DEFAULT_BACKEND_BLOCK_MULTIPLE = 16


def vllm_block_size_problem(block_size: int) -> str | None:
    """Why vLLM refuses ``block_size`` (naming the sizes it takes), or None."""
    if block_size in VLLM_BLOCK_SIZES:
        return None
    lo, hi = knob_range("block_size")
    offered = ", ".join(str(b) for b in VLLM_BLOCK_SIZES if lo <= b <= hi)
    return (f"{spec_path('block_size')}={block_size}: vLLM's --block-size takes only "
            f"{offered}; use one of them or backend: builtin")


def engine_field(name: str) -> dataclasses.Field[Any]:
    for f in dataclasses.fields(EngineConfig):
        if f.name == name:
            return f
    raise KeyError(f"EngineConfig has no knob {name!r}")


def knob_range(name: str) -> tuple[float, float]:
    """The knob's [lo, hi] from EngineConfig (both ends inclusive)."""
    meta = engine_field(name).metadata
    if meta.get("lo") is None or meta.get("hi") is None:
        raise KeyError(f"knob {name!r} has no numeric range")
    return meta["lo"], meta["hi"]


def knob_schema(name: str) -> dict[str, Any]:
    """OpenAPI v3 schema of one knob: type from the default, bounds and enums from metadata."""
    f = engine_field(name)
    meta, default = f.metadata, f.default
    schema: dict[str, Any] = {"description": meta["doc"]}
    choices = meta.get("choices")
    if isinstance(default, enum.Enum):
        schema["type"] = "string"
        schema["enum"] = [c.value for c in choices or type(default)]
    elif isinstance(default, bool):
        schema["type"] = "boolean"
    elif isinstance(default, int):
        schema["type"] = "integer"
    else:
        schema["type"] = "number"
    if choices is not None and not isinstance(default, enum.Enum):
        schema["enum"] = list(choices)
    lo, hi = meta.get("lo"), meta.get("hi")
    if lo is not None:
        schema["minimum"] = lo
    if hi is not None:
        schema["maximum"] = hi
    return schema


def spec_path(name: str) -> str:
    """``spec.engine.preemption.mode`` for ``preemption_mode``: how users see a knob."""
    return "spec.engine." + ".".join(FIELD_PATHS[name])


def engine_config(spec: Mapping[str, Any], profile: str, problems: list[str]
                  ) -> tuple[EngineConfig, frozenset[str]]:
    """``spec.engine`` over the ``profile`` preset, and the knobs the user set; each bad
    knob is appended to ``problems`` (and left at the preset)."""
    explicit: dict[str, Any] = {}
    engine = spec.get("engine") or {}
    for path, name in KNOB_PATHS.items():
        node: Any = engine
        for part in path:
            node = node.get(part) if isinstance(node, Mapping) else None
        if node is None:
            continue
        try:
            explicit[name] = coerce_knob(name, node)
            EngineConfig().with_overrides({name: explicit[name]})
        except ConfigError as exc:
            if len(exc.fields) < 2:  # a cross-field rule is judged on the whole config below
                problems.append(f"{spec_path(name)}: {exc}")
                explicit.pop(name, None)
    base = PRESETS[profile]
    try:
        return EngineConfig().with_overrides({**base, **explicit}), frozenset(explicit)
    except ConfigError:
        budget = explicit.get("token_budget", base["token_budget"])
        chunk = explicit.get("chunk_size", base["chunk_size"])
        problems.append(
            f"{spec_path('chunk_size')}={chunk} exceeds {spec_path('token_budget')}={budget} "
            f"(after the '{profile}' preset and budget alignment): lower chunkSize "
            "or raise tokenBudget")
        return EngineConfig(), frozenset(explicit)


def bound_problem(name: str, where: str, written: Mapping[str, int], engine: EngineConfig
                  ) -> str | None:
    """What is wrong with the ends ``written`` at ``where`` for knob ``name`` (an end left
    out is ``slopilot tune``'s), given the spec's ``engine``; None when they hold."""
    lo_k, hi_k = knob_range(name)
    default = DEFAULT_BOUNDS[name]
    assert isinstance(default, IntRange)  # the CR bounds only integer knobs
    lo, hi = written.get("lo", default.lo), written.get("hi", default.hi)
    value = getattr(engine, name)
    if not (lo_k <= lo <= hi_k and lo_k <= hi <= hi_k) or (len(written) == 2 and lo > hi):
        return f"{where}=[{lo}, {hi}]: need {lo_k:g} <= min <= max <= {hi_k:g}"
    if lo > hi:  # one end written, beyond the other end it leaves to the default
        return (f"{where}.min={lo} is above the upper end {hi} it leaves to the default: set "
                "max as well" if "lo" in written else
                f"{where}.max={hi} is below the lower end {lo} it leaves to the default: set "
                "min as well")
    if ("lo" in written and value < lo) or ("hi" in written and value > hi):
        return (f"{spec_path(name)}={value} lies outside "
                f"{where}=[{lo}, {hi}]: widen the bounds or change the knob")
    return None


def engine_checksum(body: Mapping[str, Any]) -> str:
    """Which spec a tuned config was tuned from: a hash of ``spec.engine`` and
    ``spec.slo`` as the parse reads them, their CRD defaults or none (tuned_base.py)."""
    return spec_checksum(body)


def _recorded(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """``status.tunedConfig`` where it was tuned from this ``spec.engine`` and
    ``spec.slo``, whatever backend and model; None when there is none or an edit of
    those sections made it stale."""
    status = body.get("status")
    tuned = status.get("tunedConfig") if isinstance(status, Mapping) else None
    # The status subresource is the operator's, but whoever may write it (an older
    # release, a tenant granted it) can leave anything there: what is not ours is none.
    if not isinstance(tuned, Mapping) or not isinstance(tuned.get("engine"), dict) \
            or not base_matches(tuned.get("base"), body):
        return None
    return tuned


def _tuned(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """``status.tunedConfig`` where it belongs to this spec (tuned from this
    ``spec.engine`` and ``spec.slo``, on this backend and model); None when there is
    none, or an edit or a switch made it stale."""
    tuned = _recorded(body)
    return None if tuned is None or moved_from(tuned, body) is not None else tuned


def tuned_left_behind(body: Mapping[str, Any]) -> str | None:
    """Why the committed ``status.tunedConfig`` of this spec's sections is not run: it
    was tuned on another backend or model (said as a spec warning); None otherwise. An
    edit of the sections themselves leaves it behind unsaid, as it always has."""
    tuned = _recorded(body)
    return None if tuned is None else moved_from(tuned, body)


def tuned_on(body: Mapping[str, Any]) -> StudyTarget | None:
    """The backend and model the committed ``status.tunedConfig`` of this spec's sections
    was tuned on (the current ones where it names none); None without one."""
    tuned = _recorded(body)
    return None if tuned is None else recorded_target(tuned, target_of(body))


def unstamped_target(body: Mapping[str, Any]) -> dict[str, str] | None:
    """The backend and model to write into a ``status.tunedConfig`` of an earlier
    release that names neither and belongs to this spec (a merge patch's members), or
    None: read as the current ones only until then, it is left behind by a switch made
    after the upgrade, as this release's own records are."""
    tuned = _tuned(body)
    if tuned is None or ("backend" in tuned and "model" in tuned):
        return None
    return target_of(body).fields()


def left_trial_reduced(body: Mapping[str, Any]) -> dict[str, Any]:
    """The ``status`` members (a merge patch) that reduce a trial's ``status.tunedConfig``
    which a backend or model switch left behind to its committed record: the committed
    knobs kept beside the trial's as the record's, the trial's keys taken out, stamped as
    before; the record dropped where nothing was committed beneath. None ({}) where there
    is no such record. The switch ended the trial (``engine_switched``), so no daemon
    gives its record back; kept, switched back, the trial's knobs went to the pods as if
    committed (``tuned_overlay`` runs a trial's record while tuning is on).

    The record is replaced whole (``replacing``), as ``TunedStatus`` writes it: merged
    into the trial's engine map, a knob the committed record lacks (one an older release
    did not have, or ``committed: {}``, no knob over the spec's) kept the trial's value
    as committed. ``committed: {}`` stays an empty record, as ``committed_overlay`` and
    ``TunedStatus.sync`` read and write it: the spec's knobs."""
    tuned = _recorded(body)
    if tuned is None or tuned.get("trial") is not True or moved_from(tuned, body) is None:
        return {}
    reduced = committed_record(tuned)
    return {"tunedConfig": None if reduced is None else replacing(reduced, tuned)}


def committed_record(tuned: Mapping[str, Any]) -> dict[str, Any] | None:
    """A trial's ``status.tunedConfig`` record reduced to its committed record: the
    committed knobs it keeps as the record's, stamped as before (tuned from the same
    spec, on the same backend and model), the trial's keys taken out; None where nothing
    was committed beneath. Written as a merge patch, replace it whole (``replacing``)."""
    committed = tuned.get("committed")
    if not isinstance(committed, dict):
        return None
    reduced = {k: v for k, v in tuned.items() if k not in ("trial", "committed")}
    reduced["engine"] = dict(committed)
    return reduced


def trial_recorded(body: Mapping[str, Any]) -> bool:
    """Whether ``status.tunedConfig`` is a trial's (one on every replica: vLLM's, which
    roll them, or a built-in one's without a canary), not a committed config."""
    tuned = _tuned(body)
    return tuned is not None and tuned.get("trial") is True


def committed_overlay(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The committed tuned knobs: ``status.tunedConfig``'s, or, where it records a trial,
    the committed ones it keeps beside the trial's (None: none committed)."""
    tuned = _tuned(body)
    if tuned is None:
        return None
    if tuned.get("trial") is True:
        committed = tuned.get("committed")
        return cast(Mapping[str, Any], committed) if isinstance(committed, dict) else None
    return cast(Mapping[str, Any], tuned["engine"])


def tuned_record(body: Mapping[str, Any], engine: Mapping[str, Any] | None, *,
                 trial: bool) -> dict[str, Any] | None:
    """``status.tunedConfig`` for ``engine`` on every replica: committed, or a trial's,
    kept beside the committed config it runs over, which a trial that loses (its daemon
    overtaken by another's, its state reset) gives back. None: nothing committed."""
    if engine is None:
        return None
    out: dict[str, Any] = {"engine": dict(engine), "base": engine_checksum(body),
                           **target_of(body).fields()}
    if trial:
        out["trial"] = True
        if (committed := committed_overlay(body)) is not None:
            out["committed"] = dict(committed)
    return out


def committed_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """``body`` with ``status.tunedConfig`` reduced to its committed record: the object
    as it renders with no trial on every replica (a trial's record, whoever's, dropped;
    none where nothing is committed)."""
    status = body.get("status")
    kept = dict(status) if isinstance(status, Mapping) else {}
    kept["tunedConfig"] = tuned_record(body, committed_overlay(body), trial=False)
    return {**body, "status": kept}


def tuned_overlay(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """``status.tunedConfig``'s knobs while they belong to this spec (tuned from this
    ``spec.engine`` and ``spec.slo``); None when there are none or an edit made them stale.
    A trial's, recorded while tuning was on, is no longer run once it is off: no daemon
    runs a trial then (one turned off while the operator was down never restored it)."""
    tuned = _tuned(body)
    if tuned is None:
        return None
    tuning = (body.get("spec") or {}).get("tuning")
    if tuned.get("trial") is True and isinstance(tuning, Mapping) \
            and tuning.get("enabled", True) is False:
        return committed_overlay(body)
    return cast(Mapping[str, Any], tuned["engine"])


def tuned_config(body: Mapping[str, Any], engine: EngineConfig) -> EngineConfig:
    """The committed tuned knobs over ``engine`` (the spec's) where they still belong to
    this spec, else ``engine``."""
    if (tuned := tuned_overlay(body)) is None:
        return engine
    try:
        return engine.with_overrides(tuned)
    except ConfigError:
        return engine  # written by an older operator with other knobs: start over


# Where the study of a CR that names no storage lives unless the administrator names
# another (``$SLOPILOT_DEFAULT_STORAGE``: default_storage.py), and what the policy allows
# then by default (study_storage.py). Four slashes: an absolute path, the volume
# operator.yaml mounts, whatever the operator's working directory. The CRD wrote it into
# every CR created under it: such a CR keeps naming it.
DEFAULT_STUDY_STORAGE = "sqlite:////var/lib/slopilot/study.db"
MAX_STORAGE_URL = 2048
"""The longest ``spec.tuning.storage``: refusals quote the URL, and an unbounded one went
whole into the status condition (and the Event) on every reconcile."""
LEGACY_STUDY_STORAGE = "sqlite:///var/lib/slopilot/study.db"
"""The old CRD's default, kept in every LLMDeployment created under it: a path relative
to the working directory (the image's is /tmp), read as the default with a warning."""


def written_storage(value: Any) -> str | None:
    """The storage a CR's ``spec.tuning.storage`` names, as the parse reads it: None where
    it writes none (the namespace's default storage), the old CRD's relative default as
    the mounted file it meant."""
    if not isinstance(value, str):
        return None
    return DEFAULT_STUDY_STORAGE if value == LEGACY_STUDY_STORAGE else value


WINDOW_SCRAPES = 4
"""The scrapes a trial's window should span: a rate needs two samples of each replica, and
four leave room for a missed scrape and the window's settling start (Prometheus's own
advice for a rate's range)."""
MIN_WINDOW_S, MAX_WINDOW_S = 1.0, 86_400.0
"""A trial's window: a zero one divides by zero, one of years never ends a trial."""
MAX_TRIAL_S = MAX_WINDOW_S
"""A trial's longest run (``spec.tuning.maxTrial``): a day, as its window's longest, which
it is at least; one of years would hold an episode on a trickle for good."""


@dataclass(frozen=True)
class TuningSpec:
    enabled: bool
    window_s: float
    max_trials: int
    canary: bool
    min_class_requests: int
    """Finished requests of each judged class a trial's window holds before it is judged."""
    max_trial_s: float
    """The longest one trial runs; absent, the loop's default or the window, the longer."""
    storage: str | None
    """As written (the old relative default read as ``DEFAULT_STUDY_STORAGE``); None: not
    written, the namespace's default storage (``OperatorPolicy.named_storage``)."""
    bounds: Mapping[str, Mapping[str, int]]
    """EngineConfig field -> the ends the user wrote (``lo``, ``hi``); an end left out is
    ``slopilot tune``'s (``tuner/study/space.DEFAULT_BOUNDS``), a knob left out too."""
    space: SearchSpace
    """What the trials search, built once by the parse: ``slopilot tune``'s space (the same
    ``SearchSpace.from_bounds``) with these bounds, over the knobs the backend applies (a
    vLLM trial rolls every replica: only budget, chunk and max sequences, VLLM_APPLIES)."""


DEFAULT_WINDOW = "2m"
"""``spec.tuning.window`` left out (the CRD's default too)."""


def tuning_section(spec: Mapping[str, Any], engine: EngineConfig, running: EngineConfig,
                   applies: frozenset[str] | None, r: SpecReader,
                   warnings: list[str] | None = None,
                   scrape_s: float = SCRAPE_INTERVAL_S) -> TuningSpec | None:
    """``spec.tuning``: bounds judged on the spec's ``engine``, the space based on the
    ``running`` one; None (the problems in ``r`` say why) when there is no space. A field
    read in another meaning than written appends to ``warnings``."""
    window = r.get(spec, "spec.tuning.window", str, DEFAULT_WINDOW)
    try:
        window_s = parse_duration(window)
    except ValueError as exc:
        r.problems.append(f"spec.tuning.window: {exc}")
        window_s = 120.0
    if not MIN_WINDOW_S <= window_s <= MAX_WINDOW_S:
        r.problems.append(f"spec.tuning.window={window!r}: a trial's window must be "
                          f"between {MIN_WINDOW_S:g} s and {MAX_WINDOW_S:g} s (a day); "
                          "e.g. 2m")
        window_s = 120.0
    elif window_s < WINDOW_SCRAPES * scrape_s and warnings is not None:
        whose = ("the ServiceMonitor's" if scrape_s <= SCRAPE_INTERVAL_S
                 else "spec.alerts.scrapeInterval's")
        least = duration(math.ceil(WINDOW_SCRAPES * scrape_s))
        # The schema stores the default in every CR: its text is all there is to tell by.
        said = (f"spec.tuning.window={window!r} (as written, or the default the schema "
                "stores where none is)"
                if window == DEFAULT_WINDOW else f"spec.tuning.window={window!r}")
        warnings.append(
            f"{said} spans under {WINDOW_SCRAPES} of {whose} "
            f"{scrape_s:g} s scrapes: a replica may leave one "
            "sample in a window, a rate of which reads none of its requests, and the loop "
            f"rejects such a window; set spec.tuning.window to at least {least}"
            " (the ScrapeInterval condition names the interval Prometheus really scrapes at)")
    floor, max_trial_s = trial_floor(spec, window_s, r)
    trials = r.get(spec, "spec.tuning.maxTrials", int, 30)
    if not 1 <= trials <= 1000:
        r.problems.append(f"spec.tuning.maxTrials={trials}: use a value in [1, 1000]")
    bounds: dict[str, dict[str, int]] = {}
    for camel, name in BOUNDED_KNOBS.items():
        where = f"spec.tuning.bounds.{camel}"
        written = {end: value for end, key in (("lo", "min"), ("hi", "max"))
                   if (value := r.get(spec, f"{where}.{key}", int)) is not None}
        if not written:
            continue
        bounds[name] = written
        if (problem := bound_problem(name, where, written, engine)) is not None:
            r.problems.append(problem)
    space = None
    if not r.problems:
        try:  # together: e.g. a smallest chunk above every budget the bounds allow
            space = SearchSpace.from_bounds(bounds or None, base=running, applies=applies)
        except ConfigError as exc:
            r.problems.append(f"spec.tuning.bounds: {exc}")
    if space is None:
        return None
    # None: the namespace's default storage, the administrator's word (policy.py).
    storage = r.get(spec, "spec.tuning.storage", str)
    if storage is not None and len(storage) > MAX_STORAGE_URL:
        r.problems.append(f"spec.tuning.storage: {len(storage)} characters, more than the "
                          f"{MAX_STORAGE_URL} of a database URL: name the database, e.g. "
                          f"{DEFAULT_STUDY_STORAGE}, or leave it out for the namespace's "
                          "default storage")
        return None
    if storage is not None and (problem := sqlite_sidecar_problem(storage)) is not None:
        r.problems.append(problem)
        return None
    if storage == LEGACY_STUDY_STORAGE:
        storage = written_storage(storage)
        if warnings is not None:
            warnings.append(
                f"spec.tuning.storage={LEGACY_STUDY_STORAGE!r} (the old CRD's default) is a "
                "path relative to the operator's working directory; the operator opens "
                f"{DEFAULT_STUDY_STORAGE!r}, the mounted volume: write that (four slashes)")
    return TuningSpec(enabled=r.get(spec, "spec.tuning.enabled", bool, True), window_s=window_s,
                      max_trials=trials, canary=r.get(spec, "spec.tuning.canary", bool, True),
                      min_class_requests=floor, max_trial_s=max_trial_s,
                      storage=storage, bounds=bounds, space=space)


def trial_floor(spec: Mapping[str, Any], window_s: float, r: SpecReader) -> tuple[int, float]:
    """``spec.tuning.minClassRequests`` and ``spec.tuning.maxTrial`` in seconds. An absent
    maxTrial is the loop's default, or the window where that is longer: a trial runs one
    window at least, and a CR with a 30-minute window and no maxTrial is not refused."""
    floor = r.get(spec, "spec.tuning.minClassRequests", int, DEFAULT_CLASS_REQUESTS)
    if not 1 <= floor <= MAX_CLASS_REQUESTS:
        r.problems.append(
            f"spec.tuning.minClassRequests={floor}: use a whole number of requests in "
            f"[1, {MAX_CLASS_REQUESTS}] (default {DEFAULT_CLASS_REQUESTS}: the P99 of fewer "
            "is one of their few largest; lower it only to judge trials on less, "
            "knowingly)")
        floor = DEFAULT_CLASS_REQUESTS
    written = r.duration(spec, "spec.tuning.maxTrial")
    if written is None:
        return floor, max(DEFAULT_MAX_TRIAL_S, window_s)
    text, cap_s = written
    if not window_s <= cap_s <= MAX_TRIAL_S:
        r.problems.append(
            f"spec.tuning.maxTrial={text!r}: a trial's longest run must be between "
            f"tuning.window ({window_s:g} s: a trial runs one window at least) and "
            f"{MAX_TRIAL_S:g} s (a day); e.g. 1h for traffic too thin to reach "
            "minClassRequests in the default 20m")
        return floor, max(DEFAULT_MAX_TRIAL_S, window_s)
    return floor, cap_s
