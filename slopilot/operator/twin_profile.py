"""The operator's twin: the calibrated profile of ``spec.twin.profile``, or the datasheet.

``resolve_twin`` reads the ConfigMap the spec names, in the CR's own namespace and no
other (the name was checked to be a bare DNS name: ``twin_spec.py``), and parses its key
with the profile reader's checks: at most ``MAX_PROFILE_BYTES``, valid YAML, a
``slopilot calibrate`` profile, for this deployment's model and device kind, of today's
cost-model form and executor code. Anything else is a ``problem`` naming the ConfigMap,
the key and the fix, and the twin falls back to the datasheet roofline and says so: a
controller that plans with a wrong profile scales the wrong way, one that plans with the
datasheet at least says it is a prior.

No ConfigMap content reaches status or events unless it declares itself a profile. The
operator reads the ConfigMap with its own rights, and a tenant who may create
LLMDeployments needs no grant on the namespace's ConfigMaps: a refusal that quoted the
text (a properties file's line, a PEM body, the YAML parser's snippet of the line it
stopped at) let them read any ConfigMap of the namespace through the CR's conditions. So
a key that is not YAML, or not a mapping whose ``schema`` is a profile's, is refused by
its line and column or its type alone (``_not_a_profile``); only a document that says
``schema: slopilot.dev/cost-profile/v1``, written as a profile, gets the profile reader's
own messages, which quote its fields, bounded in length.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from slopilot.engine.sim.profile_file import (
    MAX_PROFILE_BYTES,
    check_profile_for,
    executor_code_hash,
    parse_profile_text,
)
from slopilot.engine.sim.profile_types import SCHEMA, CostProfile, ProfileFileError
from slopilot.engine.sim.scenario import Scenario
from slopilot.engine.sim.twin import with_profile
from slopilot.engine.sim.yaml_load import (
    YAMLDuplicateKeyError,
    YAMLShapeError,
    YAMLValueError,
    safe_load_bounded,
)
from slopilot.operator.conditions import ConditionType, condition
from slopilot.operator.kubeapi import ApiError, Kube
from slopilot.operator.spec import Backend, LLMDeploymentSpec
from slopilot.operator.twin_spec import ProfileRef, key_problem, name_problem

log = logging.getLogger(__name__)
MAX_MESSAGE = 600
FIX = ("fix the ConfigMap (write it with `slopilot calibrate --model MODEL --out FILE`, then "
       "`kubectl create configmap NAME --from-file=profile.yaml=FILE`) or remove "
       "spec.twin.profile")


@dataclass(frozen=True)
class TwinChoice:
    """What the controller's twin runs, and why."""

    profile: CostProfile | None = None
    source: str | None = None
    """``ConfigMap ns/name key 'k'`` when the spec names a profile."""
    problem: str | None = None
    """Why the named profile is not used (the twin then runs the datasheet)."""
    version: str | None = None
    """The ConfigMap's resourceVersion read (a change is read again)."""
    ref: ProfileRef | None = None

    @property
    def calibrated(self) -> bool:
        return self.profile is not None

    def apply(self, base: Scenario) -> Scenario:
        """``base`` on the profile's hardware and model (one replica = the profile's TP
        group); ``base`` itself, the datasheet, without a profile."""
        if self.profile is None:
            return base
        p = self.profile
        on_model = dataclasses.replace(base, model=p.model.name, tp=p.tp, num_gpus=p.tp)
        return with_profile(on_model, p)

    def describe(self) -> str:
        if self.profile is not None:
            return f"calibrated profile from {self.source} ({_short(self.profile.name)})"
        if self.problem is not None:
            return f"uncalibrated datasheet roofline: {self.source} refused"
        return "uncalibrated datasheet roofline (no spec.twin.profile)"

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {"calibrated": self.calibrated, "runs": self.describe()}
        if self.source is not None:
            out["source"] = self.source
        return out

    def condition(self, generation: int | None) -> dict[str, Any]:
        if self.profile is not None:
            return condition(ConditionType.TWIN_CALIBRATED, True, "ProfileLoaded",
                             f"the twin runs the {self.describe()}", generation)
        if self.problem is not None:
            return condition(ConditionType.TWIN_CALIBRATED, False, "ProfileRefused",
                             f"{self.problem}; the twin falls back to the uncalibrated "
                             "datasheet roofline", generation)
        return condition(ConditionType.TWIN_CALIBRATED, False, "NoProfile",
                         "the twin runs the uncalibrated datasheet roofline; name a "
                         "calibrated profile in spec.twin.profile", generation)


def _refused(ref: ProfileRef, source: str, message: str, version: str | None = None
             ) -> TwinChoice:
    return TwinChoice(source=source, problem=_short(message, MAX_MESSAGE), version=version,
                      ref=ref)


MAX_NAME = 80
"""Characters of the profile's name that status and the condition quote."""


def _short(text: str, limit: int = MAX_NAME) -> str:
    return text if len(text) <= limit else text[:limit] + " ..."


def config_map_version(kube: Kube, namespace: str, ref: ProfileRef) -> str | None:
    """The ConfigMap's resourceVersion now (None: absent or unreadable)."""
    try:
        cm = kube.get("v1", "configmaps", namespace, ref.config_map)
    except ApiError:
        return None
    return None if cm is None else str((cm.get("metadata") or {}).get("resourceVersion", ""))


def resolve_twin(kube: Kube, namespace: str, spec: LLMDeploymentSpec) -> TwinChoice:
    """The twin for ``spec`` in ``namespace`` (the CR's own); see the module docstring."""
    ref = spec.twin.profile
    if ref is None:
        return TwinChoice()
    source = ref.where(namespace)
    # Checked again here, before any request: a name with a '/' would be another path.
    if bad := name_problem("spec.twin.profile.configMapName", ref.config_map) or \
            key_problem("spec.twin.profile.key", ref.key):
        return _refused(ref, source, bad)
    try:
        cm = kube.get("v1", "configmaps", namespace, ref.config_map)
    except ApiError as exc:
        return _refused(ref, source, f"{source}: the operator cannot read it ({exc.status} "
                        f"{exc.reason}); grant it get on configmaps in {namespace}, or "
                        "remove spec.twin.profile")
    if cm is None:
        return _refused(ref, source, f"{source}: no such ConfigMap in namespace {namespace} "
                        f"(the twin reads this namespace only); {FIX}")
    version = str((cm.get("metadata") or {}).get("resourceVersion", "")) or None
    try:
        return _parse(cm, ref, source, version, spec)
    # The tenant's text must never take the daemon down: an exception out of here ended
    # DeploymentLoop.step(), kopf restarted the daemon every 10 s for ever (parsing the
    # ConfigMap again each time) and the CR never said why it was not tuning. Refused,
    # the answer is kept for this ConfigMap version like any other (TwinTracker).
    except Exception as exc:
        log.exception("%s: reading the twin's profile failed", source)
        return _refused(ref, source, f"{source}: the operator could not read it "
                        f"({type(exc).__name__}, in its log); {FIX}", version)


def _parse(cm: Mapping[str, Any], ref: ProfileRef, source: str, version: str | None,
           spec: LLMDeploymentSpec) -> TwinChoice:
    data = cm.get("data") or {}
    text = data.get(ref.key) if isinstance(data, Mapping) else None
    if text is None:
        where = "binaryData" if ref.key in (cm.get("binaryData") or {}) else None
        keys = sorted(map(str, data))[:10] if isinstance(data, Mapping) else []
        hint = ("it is under binaryData: store the profile as text (--from-file does)"
                if where else f"its keys are {', '.join(keys) or 'none'}")
        return _refused(ref, source, f"{source}: no such key ({hint}); set spec.twin.profile.key "
                        f"or {FIX}", version)
    if not isinstance(text, str):
        return _refused(ref, source, f"{source}: not text; {FIX}", version)
    size = len(text.encode())
    if size > MAX_PROFILE_BYTES:
        return _refused(ref, source, f"{source}: {size} bytes is no cost profile (they are a few "
                        f"KiB, at most {MAX_PROFILE_BYTES}); {FIX}", version)
    if spec.backend is not Backend.BUILTIN:
        return _refused(ref, source, f"{source}: a calibrated profile times slopilot's built-in "
                        f"engine, not {spec.backend.value}; remove spec.twin.profile", version)
    if (why := _not_a_profile(text)) is not None:
        return _refused(ref, source, f"{source}: {why}; {FIX}", version)
    try:
        profile = parse_profile_text(text, source)
        check_profile_for(profile, model=spec.model_name,
                          device="cuda" if spec.gpu > 0 else "cpu")
    except ProfileFileError as exc:
        return _refused(ref, source, f"{exc}; {FIX}", version)
    if stale := profile.staleness(executor_code_hash()):
        return _refused(ref, source, f"{'; '.join(stale)} (the ConfigMap's profile is older than "
                        "this engine: recalibrate and update the ConfigMap)", version)
    return TwinChoice(profile=profile, source=source, version=version, ref=ref)


def _at(mark: yaml.Mark | None, *, column: bool = True) -> str:
    """Where in the text, for a message that quotes none of it."""
    if mark is None:
        return ""
    return f" at line {mark.line + 1}" + (f", column {mark.column + 1}" if column else "")


def _not_a_profile(text: str) -> str | None:
    """Why ``text`` is no cost profile, in words that quote none of it (module docstring);
    None where it is a mapping that declares the profile schema."""
    try:
        doc = safe_load_bounded(text)
    except YAMLShapeError as exc:  # its own words, none of the text's
        return f"not a slopilot cost profile: {exc}"
    except YAMLValueError as exc:
        if _declares_profile(exc.root):
            return None  # the profile reader names the field, as it may
        return f"a value{_at(exc.problem_mark)} is no {exc.kind}, so not a slopilot cost profile"
    except YAMLDuplicateKeyError as exc:
        if _declares_profile(exc.root):
            return None  # the profile reader names the key, as it may
        at = _at(exc.problem_mark, column=False)
        return f"a key{at} is given twice, so not a slopilot cost profile"
    except yaml.MarkedYAMLError as exc:
        # Only where: the parser's message quotes the line (and names aliases, tags).
        at = _at(exc.problem_mark or exc.context_mark)
        return f"not valid YAML{at}, so not a slopilot cost profile"
    except yaml.YAMLError:
        return "not valid YAML, so not a slopilot cost profile"
    if not isinstance(doc, Mapping):
        kind = {str: "text", list: "a list", type(None): "nothing", bool: "true or false",
                int: "a number", float: "a number"}.get(type(doc), "a single value")
        return f"it holds {kind}, not a YAML mapping: not a slopilot cost profile"
    if doc.get("schema") != SCHEMA:
        return _NO_SCHEMA
    return None


_NO_SCHEMA = (f"not a slopilot cost profile: a profile is a mapping with schema: {SCHEMA} "
              "(the `slopilot calibrate --out` file), and this one has another or none")


def _declares_profile(root: yaml.Node) -> bool:
    """Whether the composed document is a mapping whose ``schema`` is a profile's."""
    return isinstance(root, yaml.MappingNode) and any(
        isinstance(k, yaml.ScalarNode) and k.value == "schema" and
        isinstance(v, yaml.ScalarNode) and v.value == SCHEMA for k, v in root.value)
