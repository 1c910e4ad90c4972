"""Service-level objectives per priority class, and the named profiles.

An ``SLOSpec`` is what a deployment promises: P99 TTFT and TBT per class, how many
preemptions per minute it tolerates and, where prefix caching is expected to work
(multi-turn chat), the least prefix hit ratio. The tuner's constraints and the
Prometheus rules are both rendered from it.

Preemptions and prefix hits are counted for the whole engine, not per class: where a
rule needs one limit, it takes the strictest class's (``max_preemptions_per_min``).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slopilot.engine.json_keys import JsonFileError, read_json_file
from slopilot.engine.request import Priority, Request

SLO_FILE_ENV = "SLOPILOT_SLO_FILE"
"""Where ``slopilot serve`` reads the SLO it judges requests by when ``--slo`` is not
given: what the operator's pods get (an image too old to know it ignores it)."""


WITHIN_TTFT_TARGET = "within_ttft_target"
"""The label of the counts of clients gone before a first token (the built-in engine's
``metric_names.ABANDONED``, the meter's ``CLIENT_ABANDONED``): "true" where the client
left within its class's TTFT target (``ClassSLO.left_within_ttft``), so it missed
nothing; "false" where it had waited past it, or there was no target to wait for (no SLO
known, no TTFT objective). The rules read the ones not "true" (an image from before the
label: all) as first tokens never given (``rules.bucket_rates``)."""


def slo_term(measured: float, limit: float) -> float:
    """How far a measured figure lies from its limit, as a share of it: ``measured / limit
    - 1`` (0 at the limit, 0.5 half over). The tuner's constraint terms
    (``tuner/study/objective.py``) are this, and so is the TBT sweep's limit
    (``sim/window_stats.tbt_limit_s``): a P99 at the limit is judged alike by both, to the
    ulp, where one built apart differed by one."""
    return measured / limit - 1.0


def term_holds(term: float, margin: float) -> bool:
    """Whether a term (``slo_term``) leaves ``margin`` headroom: at most ``-margin``."""
    return term <= -margin


class SLOError(ValueError):
    """An SLO spec field is missing, unknown or out of range; the message names the fix.

    ``field`` is the field's path as the message names it (``classes.p0.ttft_p99_ms``),
    None when no single field is wrong: PUT /admin/slo answers it as the error's
    ``param``, as /admin/config answers ``ConfigError.field``."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


# The CR's spelling of each objective (its CRD field, camelCase), accepted beside the
# Python one; maxPreemptionsPerMin as an older spelling.
_CAMEL = {"ttft_p99_ms": "ttftP99Ms", "tbt_p99_ms": "tbtP99Ms",
          "max_preemptions_per_min": "maxPreemptionsPerMinute",
          "prefix_hit_min": "prefixHitMin"}
_ALIASES = {camel: name for name, camel in _CAMEL.items()} | {
    "maxPreemptionsPerMin": "max_preemptions_per_min"}


def _unknown_objective(key: str, names: set[str]) -> str:
    """The error of an unknown objective, in the spelling its key was written in (a CR's
    camelCase or the file's snake_case), with the nearest name where one is close."""
    shown = sorted(_CAMEL[n] for n in names) if any(c.isupper() for c in key) \
        else sorted(names)
    near = difflib.get_close_matches(key, shown, n=1, cutoff=0.75)
    hint = f" (did you mean {near[0]}?)" if near else ""
    return f"unknown objective{hint}; use one of: {', '.join(shown)}"


@dataclass(frozen=True, slots=True)
class ClassSLO:
    """One class's objectives; ``None`` means best effort (no rule, no constraint)."""

    ttft_p99_ms: float | None = None
    tbt_p99_ms: float | None = None
    max_preemptions_per_min: float | None = None
    prefix_hit_min: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_p99_ms", "tbt_p99_ms", "max_preemptions_per_min"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or value <= 0:
                raise SLOError(f"{name}={value!r}: expected a positive number, "
                               "or null for best effort", name)
        hit = self.prefix_hit_min
        if hit is not None and (isinstance(hit, bool) or not isinstance(hit, (int, float))
                                or not 0 < hit <= 1):
            raise SLOError(f"prefix_hit_min={hit!r}: expected a ratio in (0, 1], "
                           "or null when prefix caching is not expected", "prefix_hit_min")

    @property
    def best_effort(self) -> bool:
        return self.ttft_p99_ms is None and self.tbt_p99_ms is None

    @property
    def label(self) -> str:
        """The latency objectives a request of this class is judged by (``met``), as the
        ``slo`` label of the engine's verdict series (metrics.py) and of the rules that
        read them (rules.py): both take it from here, so verdicts counted under other
        objectives (an SLO edited since) are never read as this one's."""
        parts = [f"{name}={float(value)!r}" for name in ("ttft_p99_ms", "tbt_p99_ms")
                 if (value := getattr(self, name)) is not None]
        return ",".join(parts) or "best_effort"

    def met(self, ttft_s: float, gaps: int, gaps_over_tbt: int) -> bool:
        """Whether one finished request met this class's objectives: the one rule that
        goodput and SLO attainment count by, in the simulator and the simulated cluster.

        Its TTFT is within the TTFT target, and its own P99 token gap within the TBT
        target: at most 1 % of its ``gaps`` lie above it (``gaps_over_tbt``).
        """
        ttft_ok = self.ttft_p99_ms is None or ttft_s <= self.ttft_p99_ms / 1000.0
        return ttft_ok and gaps_over_tbt <= 0.01 * gaps

    def left_within_ttft(self, waited_s: float) -> bool:
        """Whether a client that left after ``waited_s`` with no first token left within
        the TTFT target, so that it missed nothing (``met`` reads it so): False where it
        had waited past it, or where there is no TTFT target to have waited for."""
        return self.ttft_p99_ms is not None and waited_s <= self.ttft_p99_ms / 1000.0

    def to_dict(self) -> dict[str, float | None]:
        return dataclasses.asdict(self)


def _tier(tbt_p1_ms: float) -> dict[Priority, ClassSLO]:
    return {
        Priority.P0: ClassSLO(ttft_p99_ms=100, tbt_p99_ms=20, max_preemptions_per_min=10),
        Priority.P1: ClassSLO(ttft_p99_ms=500, tbt_p99_ms=tbt_p1_ms,
                              max_preemptions_per_min=10),
        Priority.P2: ClassSLO(),
    }


PROFILES: dict[str, dict[Priority, ClassSLO]] = {
    # The latency tiers (their knob presets: config.PRESETS): the P1 TBT bound sets the
    # tier; P0 is always realtime.
    "strict": _tier(50),
    "standard": _tier(100),
    "relaxed": _tier(200),
}


@dataclass(frozen=True, slots=True)
class SLOSpec:
    """Objectives for every class (p0, p1, p2) of one deployment."""

    p0: ClassSLO
    p1: ClassSLO
    p2: ClassSLO
    profile: str | None = None

    def __post_init__(self) -> None:
        for p in Priority:
            if not isinstance(getattr(self, p.label), ClassSLO):
                raise SLOError(f"{p.label}: expected a ClassSLO, got "
                               f"{type(getattr(self, p.label)).__name__}")

    @classmethod
    def from_profile(cls, name: str) -> SLOSpec:
        if name not in PROFILES:
            raise SLOError(f"unknown SLO profile {name!r}; use one of: {', '.join(PROFILES)}")
        classes = PROFILES[name]
        return cls(classes[Priority.P0], classes[Priority.P1], classes[Priority.P2],
                   profile=name)

    def class_slo(self, priority: Priority | str | int) -> ClassSLO:
        try:
            p = Priority.parse(priority)
        except ValueError as exc:
            raise SLOError(str(exc)) from None
        slo: ClassSLO = getattr(self, p.label)
        return slo

    def classes(self) -> dict[Priority, ClassSLO]:
        return {p: self.class_slo(p) for p in Priority}

    @property
    def max_preemptions_per_min(self) -> float | None:
        """The engine-wide limit: the strictest class's, None when no class sets one."""
        limits = [c.max_preemptions_per_min for c in self.classes().values()
                  if c.max_preemptions_per_min is not None]
        return min(limits) if limits else None

    @property
    def prefix_hit_min(self) -> float | None:
        """The engine-wide expected hit ratio: the highest any class asks for."""
        mins = [c.prefix_hit_min for c in self.classes().values()
                if c.prefix_hit_min is not None]
        return max(mins) if mins else None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SLOSpec:
        """Build from a mapping (CLI file, CRD ``spec.slo``).

        ``profile`` (default ``standard``) gives the base; ``classes.<p0|p1|p2>`` override
        fields of one class; top-level ``max_preemptions_per_min`` and ``prefix_hit_min``
        apply to every class. camelCase spellings of the CRD are accepted.
        """
        if not isinstance(data, Mapping):
            raise SLOError(f"SLO spec: expected a mapping, got {type(data).__name__}")
        data = {_ALIASES.get(k, k): v for k, v in data.items()}
        known = {"profile", "classes", "max_preemptions_per_min", "prefix_hit_min"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SLOError(f"unknown SLO field(s) {', '.join(map(repr, unknown))}; "
                           f"known fields: {', '.join(sorted(known))}", unknown[0])
        profile = data.get("profile")
        if profile is not None and not isinstance(profile, str):
            raise SLOError(f"profile={profile!r}: expected a name: {', '.join(PROFILES)}",
                           "profile")
        if profile is not None and profile not in PROFILES:
            raise SLOError(f"profile={profile!r}: unknown SLO profile; use one of: "
                           f"{', '.join(PROFILES)}", "profile")
        base = cls.from_profile(profile or "standard").classes()
        shared: dict[str, Any] = {
            k: data[k] for k in ("max_preemptions_per_min", "prefix_hit_min") if k in data}
        ClassSLO(**shared)  # a bad shared value is named where it was written, not per class
        classes_in = data.get("classes") or {}
        if not isinstance(classes_in, Mapping):
            raise SLOError("classes: expected a mapping of p0/p1/p2 to objectives", "classes")
        overrides: dict[Priority, Mapping[str, Any]] = {}
        for key, fields in classes_in.items():
            try:
                p = Priority.parse(key)
            except ValueError:
                raise SLOError(f"classes.{key}: not a class; use p0, p1 or p2",
                               f"classes.{key}") from None
            if not isinstance(fields, Mapping):
                raise SLOError(f"classes.{key}: expected a mapping of objectives",
                               f"classes.{key}")
            overrides[p] = fields
        built: dict[Priority, ClassSLO] = {}
        names = {f.name for f in dataclasses.fields(ClassSLO)}
        for p, slo in base.items():
            changes = dict(shared)
            for k, v in overrides.get(p, {}).items():
                k = _ALIASES.get(k, k)
                if k not in names:
                    raise SLOError(f"classes.{p.label}.{k}: {_unknown_objective(k, names)}",
                                   f"classes.{p.label}.{k}")
                changes[k] = v
            try:
                built[p] = dataclasses.replace(slo, **changes)
            except SLOError as exc:
                raise SLOError(f"classes.{p.label}.{exc}",
                               exc.field and f"classes.{p.label}.{exc.field}") from None
        return cls(built[Priority.P0], built[Priority.P1], built[Priority.P2],
                   profile=profile)

    def to_dict(self) -> dict[str, Any]:
        """A mapping ``from_dict`` reads back to an equal spec."""
        out: dict[str, Any] = {} if self.profile is None else {"profile": self.profile}
        out["classes"] = {p.label: self.class_slo(p).to_dict() for p in Priority}
        return out


class SLOJudge:
    """Whether each finished request met its class's SLO (``ClassSLO.met``, the one rule).

    An engine observer's helper: it counts, per live request, the token gaps above the
    class's TBT target (rare, so kept sparse) until the request finishes.
    """

    def __init__(self, slo: SLOSpec) -> None:
        self._classes = slo.classes()
        self._tbt_s = {p: None if c.tbt_p99_ms is None else c.tbt_p99_ms / 1000.0
                       for p, c in self._classes.items()}
        self._over: dict[str, int] = {}

    def on_token_gap(self, req: Request, gap_s: float) -> None:
        limit = self._tbt_s[req.priority]
        if limit is not None and gap_s > limit:
            self._over[req.request_id] = self._over.get(req.request_id, 0) + 1

    def class_slo(self, priority: Priority) -> ClassSLO:
        return self._classes[priority]

    def finished(self, req: Request) -> bool | None:
        """Met or not; None for a request that ended without a token (nothing to judge)."""
        over = self._over.pop(req.request_id, 0)
        if req.first_token_time is None:
            return None
        # Its gaps: one an engine output after the first, each of one token here (no
        # speculative decoding), so one a token; the live server counts one a chunk it
        # wrote (``ClientGaps``), the same where no output waited for another's write.
        return self._classes[req.priority].met(req.first_token_time - req.arrival_time,
                                               req.num_output_tokens - 1, over)


SLO_FILE_BYTES = 1 << 20
"""The most of an SLO file read: the operator writes it from ``spec.slo`` into a
ConfigMap (at most 1 MiB); a hand-written one is a few hundred bytes."""


def read_slo_file(path: Path) -> SLOSpec:
    """The objectives in the JSON file ``path`` (``spec.slo``'s shape); SLOError naming
    the file where it cannot be read, is not JSON, or is not an SLO."""
    try:
        data = read_json_file(path, SLO_FILE_BYTES)
    except JsonFileError as exc:
        raise SLOError(str(exc)) from None
    try:
        return SLOSpec.from_dict(data)
    except SLOError as exc:
        raise SLOError(f"{path}: {exc}", exc.field) from None
