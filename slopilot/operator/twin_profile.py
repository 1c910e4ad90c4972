"""The operator's twin: the calibrated profile of ``spec.twin.profile``, or the datasheet.

``resolve_twin`` reads the ConfigMap the spec names, in the CR's own namespace and no
other (the name was checked to be a bare DNS name: ``twin_spec.py``), and parses its key
with the profile reader's checks: at most ``MAX_PROFILE_BYTES``, valid YAML, a
``slopilot calibrate`` profile, for this deployment's model and device kind, of today's
cost-model form and executor code. Anything else is a ``problem`` naming the ConfigMap,
the key and the fix, and the twin falls back to the datasheet roofline and says so: a
controller that plans with a wrong profile scales the wrong way, one that plans with the
datasheet at least says it is a prior.

No ConfigMap content reaches status or events unless its writer said it may. The
operator reads the ConfigMap with its own rights, and a tenant who may create
LLMDeployments needs no grant on the namespace's ConfigMaps: a refusal that quoted the
text (a properties file's line, a PEM body, the YAML parser's snippet of the line it
stopped at) let them read any ConfigMap of the namespace through the CR's conditions, and
one that named the ConfigMap's keys, a value's type (a number, true or false), a YAML
error's line and column or an oversized value's size let them probe it a key at a time.
So the detail is told to the CR only where the ConfigMap's writer marked it, which the
CR's author (who controls the CR, not the ConfigMap) cannot forge:

- a ConfigMap labelled ``slopilot.dev/profile: "true"`` (``PROFILE_LABEL``) gets every
  refusal in full (its key names, where its YAML broke, a value's size), never quoting a
  value;
- a key whose YAML declares ``schema: slopilot.dev/cost-profile/v1`` gets the profile
  reader's own messages (another model, stale, a bad field), which quote its fields,
  bounded in length: the text says it is a profile;
- anything else (no such ConfigMap, no such key, binaryData, over ``MAX_PROFILE_BYTES``,
  not YAML, not a profile, whatever raised before the text declared itself) is one
  refusal, the same words for each (``unseen_message``), with the fix for whoever meant
  a profile there; the detail goes to the operator's log only. Such a value that does
  not even contain the schema's name is refused unparsed, in the time a missing key
  takes.

A vLLM deployment's profile is refused before any read, so that refusal says nothing of
the ConfigMap either.
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
PROFILE_LABEL = "slopilot.dev/profile"
"""Set to ``"true"`` on a profile's ConfigMap (docs/operations.md): refusals tell the CR why."""
FIX = ("fix the ConfigMap (write it with `slopilot calibrate --model MODEL --out FILE`, then "
       "`kubectl create configmap NAME --from-file=profile.yaml=FILE` and `kubectl label "
       "configmap NAME slopilot.dev/profile=true`) or remove spec.twin.profile")


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
    if spec.backend is not Backend.BUILTIN:  # before the read: this says nothing of it
        return _refused(ref, source, f"{source}: a calibrated profile times slopilot's built-in "
                        f"engine, not {spec.backend.value}; remove spec.twin.profile")
    try:
        cm = kube.get("v1", "configmaps", namespace, ref.config_map)
    except ApiError as exc:  # the operator's grants, the same for every ConfigMap name
        return _refused(ref, source, f"{source}: the operator cannot read it ({exc.status} "
                        f"{exc.reason}); grant it get on configmaps in {namespace}, or "
                        "remove spec.twin.profile")
    if cm is None:
        return _unseen(ref, namespace, source, "no such ConfigMap in this namespace", None)
    version = str((cm.get("metadata") or {}).get("resourceVersion", "")) or None
    labelled = is_labelled_profile(cm)
    try:
        return _parse(cm, ref, source, version, spec, labelled, namespace)
    # The tenant's text must never take the daemon down: an exception out of here ended
    # DeploymentLoop.step(), kopf restarted the daemon every 10 s for ever (parsing the
    # ConfigMap again each time) and the CR never said why it was not tuning. Refused,
    # the answer is kept for this ConfigMap version like any other (TwinTracker).
    except Exception as exc:
        log.exception("%s: reading the twin's profile failed", source)
        why = f"the operator could not read it ({type(exc).__name__}, in its log)"
        if not labelled:  # raised before the text declared itself: its type could tell
            return _unseen(ref, namespace, source, why, version)
        return _refused(ref, source, f"{source}: {why}; {FIX}", version)


def is_labelled_profile(cm: Mapping[str, Any]) -> bool:
    """Whether the ConfigMap's writer labelled it a profile (``PROFILE_LABEL``)."""
    labels = (cm.get("metadata") or {}).get("labels")
    return isinstance(labels, Mapping) and labels.get(PROFILE_LABEL) == "true"


def unseen_message(namespace: str, ref: ProfileRef) -> str:
    """The one refusal of a ConfigMap not labelled a profile, whatever is wrong with it
    (module docstring): it depends on the CR's own reference alone."""
    return (f"{ref.where(namespace)}: no cost profile there that the operator may describe "
            "(the ConfigMap or the key is missing, or holds no profile, and the ConfigMap "
            f"is not labelled {PROFILE_LABEL}=true; the operator's log says which); write one "
            "with `slopilot calibrate --model MODEL --out FILE`, then `kubectl -n "
            f"{namespace} create configmap {ref.config_map} --from-file={ref.key}=FILE` and "
            f"`kubectl -n {namespace} label configmap {ref.config_map} "
            f"{PROFILE_LABEL}=true`, or remove spec.twin.profile")


def _unseen(ref: ProfileRef, namespace: str, source: str, detail: str,
            version: str | None) -> TwinChoice:
    log.warning("%s: twin profile refused: %s (the CR is told only unseen_message: the "
                "ConfigMap is not labelled %s=true)", source, detail, PROFILE_LABEL)
    return _refused(ref, source, unseen_message(namespace, ref), version)


def _parse(cm: Mapping[str, Any], ref: ProfileRef, source: str, version: str | None,
           spec: LLMDeploymentSpec, labelled: bool, namespace: str) -> TwinChoice:
    def refuse(detail: str, fix: str = FIX) -> TwinChoice:
        if not labelled:
            return _unseen(ref, namespace, source, detail, version)
        return _refused(ref, source, f"{source}: {detail}; {fix}", version)

    data = cm.get("data") or {}
    text = data.get(ref.key) if isinstance(data, Mapping) else None
    if text is None:
        where = "binaryData" if ref.key in (cm.get("binaryData") or {}) else None
        keys = sorted(map(str, data))[:10] if isinstance(data, Mapping) else []
        hint = ("it is under binaryData: store the profile as text (--from-file does)"
                if where else f"its keys are {', '.join(keys) or 'none'}")
        return refuse(f"no such key ({hint})", f"set spec.twin.profile.key or {FIX}")
    if not isinstance(text, str):
        return refuse("not text")
    size = len(text.encode())
    if size > MAX_PROFILE_BYTES:
        return refuse(f"{size} bytes is no cost profile (they are a few KiB, at most "
                      f"{MAX_PROFILE_BYTES})")
    # Unlabelled and without the schema's name, it cannot declare itself a profile:
    # refused unparsed, as fast as a missing key (parsing 256 KiB takes most of a
    # second, and how long the condition took to come told a large value apart).
    if not labelled and SCHEMA not in text:
        return refuse(f"no `schema: {SCHEMA}` in it, so not a slopilot cost profile")
    if (why := _not_a_profile(text)) is not None:
        return refuse(why)
    # From here the text declares itself a profile: the reader's words may be told.
    try:
        profile = parse_profile_text(text, source)
        check_profile_for(profile, model=spec.model_name,
                          device="cuda" if spec.gpu > 0 else "cpu")
    except ProfileFileError as exc:
        return _refused(ref, source, f"{exc}; {FIX}", version)
    except Exception as exc:
        log.exception("%s: reading the twin's profile failed", source)
        return _refused(ref, source, f"{source}: the operator could not read it "
                        f"({type(exc).__name__}, in its log); {FIX}", version)
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
