"""``spec.twin``: which cost model the controller's twin (probe, planner, warm starts) runs.

    twin:
      profile: {configMapName: smollm2-h100-profile, key: profile.yaml}

The profile is a ``slopilot calibrate`` file stored in a ConfigMap of the LLMDeployment's
own namespace. A reference names the ConfigMap only: there is no namespace field, and a
name is a DNS subdomain (no ``/``), so a tenant cannot make the operator read another
team's ConfigMaps through it. Without ``spec.twin.profile`` the twin is the datasheet
roofline of the operator's base scenario (uncalibrated), as before.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DEFAULT_KEY = "profile.yaml"
# Kubernetes' own rules: a ConfigMap name is a DNS-1123 subdomain, a data key is
# [-._a-zA-Z0-9]+; both at most 253 characters.
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"
MAX_NAME = 253
_NAME, _KEY = re.compile(NAME_PATTERN), re.compile(KEY_PATTERN)
FIELDS = ("configMapName", "key")


@dataclass(frozen=True)
class ProfileRef:
    """A ConfigMap key in the CR's namespace holding a calibrated cost profile."""

    config_map: str
    key: str = DEFAULT_KEY

    def where(self, namespace: str) -> str:
        return f"ConfigMap {namespace}/{self.config_map} key {self.key!r}"


def name_problem(path: str, value: object) -> str | None:
    """Why ``value`` is not a ConfigMap name of this namespace (None when it is one)."""
    if not isinstance(value, str) or not value:
        return f"{path}={value!r}: expected the name of a ConfigMap in this namespace"
    if "/" in value:
        return (f"{path}={value!r}: a ConfigMap name only, without a namespace: the twin "
                "reads ConfigMaps in this LLMDeployment's own namespace, never another's; "
                "copy the profile into a ConfigMap here")
    if len(value) > MAX_NAME or not _NAME.match(value):
        return (f"{path}={value[:80]!r}: not a ConfigMap name (lower-case letters, digits, "
                f"'-' and '.', at most {MAX_NAME} characters)")
    return None


def key_problem(path: str, value: object) -> str | None:
    if not isinstance(value, str) or not value:
        return f"{path}={value!r}: expected a key of the ConfigMap's data, e.g. {DEFAULT_KEY}"
    if len(value) > MAX_NAME or not _KEY.match(value) or value in (".", ".."):
        return (f"{path}={value[:80]!r}: not a ConfigMap key (letters, digits, '-', '_' and "
                f"'.', at most {MAX_NAME} characters)")
    return None


def parse_twin(spec: Mapping[str, Any], problems: list[str]) -> ProfileRef | None:
    """``spec.twin.profile`` as a ``ProfileRef``, appending each problem to ``problems``."""
    twin = spec.get("twin")
    if twin is None:
        return None
    if not isinstance(twin, Mapping):
        problems.append(f"spec.twin={twin!r}: expected a mapping, e.g. {{profile: "
                        "{configMapName: NAME, key: profile.yaml}}")
        return None
    if unknown := sorted(set(twin) - {"profile"}):
        problems.append(f"spec.twin: unknown field(s) {', '.join(map(str, unknown))}; "
                        "the one field is profile")
    raw = twin.get("profile")
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
