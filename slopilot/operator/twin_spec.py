"""``spec.twin``: the controller's twin (probe, planner, warm starts) in one place.

    twin:
      profile: {configMapName: smollm2-h100-profile, key: profile.yaml}
      maxError: 0.15      # corrected step-time error above which the twin is not trusted
      correction: refit   # none | rescale | refit (docs/twin.md)
      dispatch: random    # random | round_robin | least_requests: what spreads the load

``dispatch`` is how the replicas' traffic is spread, which the twin plays when it plans
capacity: the operator's ClusterIP Service (kube-proxy's iptables and nftables modes)
picks a replica at random per connection, the default; IPVS mode's default is round
robin; a gateway with a least-request policy in front of the Service sends each request
to the least loaded. Planned least-loaded behind a plain Service, the twin sized the fleet
one or two replicas short on bursts (docs/benchmarks.md, "Dispatch").

The profile is a ``slopilot calibrate`` file stored in a ConfigMap of the LLMDeployment's
own namespace. A reference names the ConfigMap only: there is no namespace field, and a
name is a DNS subdomain (no ``/``), so a tenant cannot make the operator read another
team's ConfigMaps through it. Without ``spec.twin.profile`` the twin is the datasheet
roofline of the operator's base scenario (uncalibrated), as before.

``spec.tuning.twin.{maxError, correction}`` is where the last two used to live. It is read
still, with a warning naming the old field, the new one and the fix (the operator posts it
as a Warning event and in the Valid condition): the CRD keeps it in its schema, as the API
server would otherwise prune it from existing objects without a word. A value there that
contradicts ``spec.twin`` is refused, naming both, except the old schema's own defaults.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from slopilot.engine.sim.dispatch import DEFAULT_DISPATCH, DISPATCH_CHOICES, Dispatch
from slopilot.tuner.loop.settings import TwinCorrection

DEFAULT_KEY = "profile.yaml"
# Kubernetes' own rules: a ConfigMap name is a DNS-1123 subdomain, a data key is
# [-._a-zA-Z0-9]+; both at most 253 characters.
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"
MAX_NAME = 253
_NAME, _KEY = re.compile(NAME_PATTERN), re.compile(KEY_PATTERN)
FIELDS = ("configMapName", "key")
TWIN_FIELDS = ("profile", "maxError", "correction", "dispatch")
DEFAULT_MAX_ERROR = 0.15
DEFAULT_CORRECTION = TwinCorrection.REFIT
CORRECTIONS = tuple(c.value for c in TwinCorrection)
MAX_ERROR_BOUND = 10.0
LEGACY = "spec.tuning.twin"
LEGACY_FIELDS = {"max_error": "maxError", "correction": "correction"}  # TwinSpec -> CR
# What the CRD used to default spec.tuning.twin to: every LLMDeployment created before the
# move carries these without its owner having written them, so they cannot contradict.
OLD_DEFAULTS: dict[str, Any] = {"max_error": 0.15, "correction": TwinCorrection.REFIT}
REMOVE_COMMAND = ("kubectl patch llmdeployment NAME --type=json "
                  "-p '[{\"op\": \"remove\", \"path\": \"/spec/tuning/twin\"}]'")


@dataclass(frozen=True)
class ProfileRef:
    """A ConfigMap key in the CR's namespace holding a calibrated cost profile."""

    config_map: str
    key: str = DEFAULT_KEY

    def where(self, namespace: str) -> str:
        return f"ConfigMap {namespace}/{self.config_map} key {self.key!r}"


@dataclass(frozen=True)
class TwinSpec:
    """``spec.twin``, parsed once: what the twin runs and how it is checked and corrected."""

    profile: ProfileRef | None = None
    """The calibrated profile (a ConfigMap of the CR's namespace); None: the datasheet."""
    max_error: float = DEFAULT_MAX_ERROR
    """ControllerSettings.twin_max_error: the corrected step-time error bound."""
    correction: TwinCorrection = DEFAULT_CORRECTION
    """ControllerSettings.twin_correction."""
    dispatch: Dispatch = DEFAULT_DISPATCH
    """How the load reaches the replicas, as the twin plans it (module docstring)."""


def name_problem(path: str, value: object) -> str | None:
    """Why ``value`` is not a ConfigMap name of this namespace (None when it is one)."""
    if not isinstance(value, str) or not value:
        return f"{path}={value!r}: expected the name of a ConfigMap in this namespace"
    if "/" in value:
        return (f"{path}={value!r}: a ConfigMap name only, without a namespace: the twin "
                "reads ConfigMaps in this LLMDeployment's own namespace, never another's; "
                "copy the profile into a ConfigMap here")
    if len(value) > MAX_NAME or not _NAME.fullmatch(value):
        return (f"{path}={value[:80]!r}: not a ConfigMap name (lower-case letters, digits, "
                f"'-' and '.', at most {MAX_NAME} characters)")
    return None


def key_problem(path: str, value: object) -> str | None:
    if not isinstance(value, str) or not value:
        return f"{path}={value!r}: expected a key of the ConfigMap's data, e.g. {DEFAULT_KEY}"
    if len(value) > MAX_NAME or not _KEY.fullmatch(value) or value in (".", ".."):
        return (f"{path}={value[:80]!r}: not a ConfigMap key (letters, digits, '-', '_' and "
                f"'.', at most {MAX_NAME} characters)")
    return None


def max_error_problem(path: str, value: object) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{path}={value!r}: expected a number, e.g. 0.15 for 15 %"
    if not 0 < value < MAX_ERROR_BOUND:
        return (f"{path}={value!r}: use a relative error in (0, {MAX_ERROR_BOUND:g}), "
                "e.g. 0.15 for 15 %")
    return None


def correction_problem(path: str, value: object) -> str | None:
    if value in CORRECTIONS:
        return None
    return f"{path}={value!r}: use one of {', '.join(CORRECTIONS)}"


def dispatch_problem(path: str, value: object) -> str | None:
    if isinstance(value, str) and value in DISPATCH_CHOICES:
        return None
    return (f"{path}={value!r}: use one of {', '.join(DISPATCH_CHOICES)} (random: a plain "
            "Service; round_robin: kube-proxy in IPVS mode; least_requests: a load-aware "
            "router in front)")


def _dispatch(twin: Mapping[str, Any], problems: list[str]) -> Dispatch:
    if "dispatch" not in twin:
        return DEFAULT_DISPATCH
    value = twin["dispatch"]
    if (problem := dispatch_problem("spec.twin.dispatch", value)) is not None:
        problems.append(problem)
        return DEFAULT_DISPATCH
    return Dispatch(value)


def twin_settings(path: str, twin: Mapping[str, Any], problems: list[str]
                  ) -> dict[str, Any]:
    """The ``maxError`` and ``correction`` that ``twin`` (at ``path``) sets and that are
    good, as TwinSpec's fields; each bad one a problem."""
    out: dict[str, Any] = {}
    for camel, attr, judge in (("maxError", "max_error", max_error_problem),
                               ("correction", "correction", correction_problem)):
        value = twin.get(camel)
        if value is None:
            continue
        if (problem := judge(f"{path}.{camel}", value)) is not None:
            problems.append(problem)
            continue
        out[attr] = float(value) if attr == "max_error" else TwinCorrection(value)
    return out


def parse_twin(spec: Mapping[str, Any], problems: list[str], warnings: list[str]
               ) -> TwinSpec:
    """``spec.twin`` (and the deprecated ``spec.tuning.twin``) as a ``TwinSpec``; each
    problem appended to ``problems``, each deprecation to ``warnings``."""
    twin = spec.get("twin")
    if twin is None:
        twin = {}
    if not isinstance(twin, Mapping):
        problems.append(f"spec.twin={twin!r}: expected a mapping, e.g. {{profile: "
                        "{configMapName: NAME}, maxError: 0.15, correction: refit}")
        twin = {}
    if unknown := sorted(set(map(str, twin)) - set(TWIN_FIELDS)):
        problems.append(f"spec.twin: unknown field(s) {', '.join(unknown)}; "
                        f"the fields are {', '.join(TWIN_FIELDS)}")
    settings = _with_legacy(spec, twin, twin_settings("spec.twin", twin, problems),
                            problems, warnings)
    return TwinSpec(profile=_profile(twin.get("profile"), problems),
                    dispatch=_dispatch(twin, problems), **settings)


def _with_legacy(spec: Mapping[str, Any], twin: Mapping[str, Any], settings: dict[str, Any],
                 problems: list[str], warnings: list[str]) -> dict[str, Any]:
    """``settings`` (spec.twin's) with what the deprecated ``spec.tuning.twin`` adds."""
    tuning = spec.get("tuning")
    old = tuning.get("twin") if isinstance(tuning, Mapping) else None
    if old is None:
        return settings
    if not isinstance(old, Mapping):
        problems.append(f"{LEGACY}={old!r}: expected a mapping; it is deprecated anyway: set "
                        f"spec.twin.maxError and spec.twin.correction and remove {LEGACY}")
        return settings
    if unknown := sorted(set(map(str, old)) - set(LEGACY_FIELDS.values())):
        problems.append(f"{LEGACY}: unknown field(s) {', '.join(unknown)}; it is deprecated: "
                        f"spec.twin holds {', '.join(TWIN_FIELDS)}")
    out = dict(settings)
    for attr, value in twin_settings(LEGACY, old, problems).items():
        camel = LEGACY_FIELDS[attr]
        was, now = f"{LEGACY}.{camel}", f"spec.twin.{camel}"
        written, kept = old[camel], twin.get(camel)
        if attr not in settings:
            out[attr] = value
            warnings.append(f"{was} is deprecated: moved to {now}; the operator applies "
                            f"{was}={written!r} for now: set {now}: {written} and remove "
                            f"{LEGACY}")
        elif settings[attr] == value:
            warnings.append(f"{was}={written!r} is deprecated and repeats {now}: remove "
                            f"{LEGACY}")
        elif value == OLD_DEFAULTS[attr]:
            warnings.append(f"{was}={written!r} is deprecated (the old CRD's defaults put it "
                            f"on every LLMDeployment created before the move); {now}="
                            f"{kept!r} applies: remove {LEGACY} ({REMOVE_COMMAND})")
        else:
            problems.append(f"{now}={kept!r} and {was}={written!r} disagree: {was} is "
                            f"deprecated, moved to {now}: keep the value you mean in {now} "
                            f"and remove {LEGACY}")
    return out


def _profile(raw: Any, problems: list[str]) -> ProfileRef | None:
    """``spec.twin.profile`` as a ``ProfileRef``, appending each problem to ``problems``."""
    if raw is None:
        return None
    mine: list[str] = []
    if not isinstance(raw, Mapping):
        mine.append(f"spec.twin.profile={raw!r}: expected {{configMapName: NAME, "
                    "key: profile.yaml}}")
    elif "namespace" in raw:
        mine.append("spec.twin.profile.namespace: not allowed: the twin reads ConfigMaps "
                    "in this LLMDeployment's own namespace only; copy the profile here")
    else:
        if unknown := sorted(set(raw) - set(FIELDS)):
            mine.append(f"spec.twin.profile: unknown field(s) "
                        f"{', '.join(map(str, unknown))}; expected {', '.join(FIELDS)}")
        mine += [p for p in (
            name_problem("spec.twin.profile.configMapName", raw.get("configMapName")),
            key_problem("spec.twin.profile.key", raw.get("key", DEFAULT_KEY))) if p]
    problems.extend(mine)
    if mine or not isinstance(raw, Mapping):
        return None
    return ProfileRef(str(raw["configMapName"]), str(raw.get("key", DEFAULT_KEY)))
