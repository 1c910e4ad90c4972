"""Alertmanager inhibit rules for the alert table: one page per fault, not four.

A stalled engine or a deployment Prometheus cannot scrape pages its own critical, and
its queue then drives every TTFT row of each class (a first token never given is a
breach: ``latency_sources``), whose advice (retune) is moot while the controller holds.
And a TTFT P99 over 2 x its SLO fires the warning row of the same alert and class too.
These rules, rendered from the table's names, tell Alertmanager to keep the lesser pages
quiet while the greater one fires, per deployment (its namespace and name labels, and the
namespace label the Prometheus enforces: a tenant may write any ``slopilot_namespace`` in
a rule of its own namespace, never that label, so a forged stall silences no other
namespace's pages):

- ``SlopilotEngineStalled`` or ``SlopilotTargetsDown`` silences every latency alert
  (``VALUE_FIGURE``: the rows that read a class's TTFT or TBT P99);
- a critical silences the warning of the same alert name and class.

Inhibition is Alertmanager's alone: Prometheus still fires every row, and the controller,
which reads Prometheus's ``ALERTS``, sees them all. ``python -m
slopilot.tuner.prometheus.inhibitions`` writes the AlertmanagerConfig manifest
(``manifests/prometheus/slopilot-inhibit-rules.yaml``); ``alertmanager_yaml()`` is the
plain ``alertmanager.yml`` snippet docs/operations.md shows.
"""

from __future__ import annotations

import argparse
import enum
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from slopilot.tuner.prometheus.alert_table import VALUE_FIGURE, AlertName, Severity
from slopilot.tuner.prometheus.rules import (
    DEPLOYMENT_LABEL,
    NAMESPACE_LABEL,
    RuleError,
    check_namespace_label,
)

BLINDING_ALERTS = (AlertName.ENGINE_STALLED, AlertName.TARGETS_DOWN)
"""Alerts under which the latency figures say nothing a person can act on: no token is
made, or none is read."""
LATENCY_ALERTS = tuple(AlertName(name) for name, figure in VALUE_FIGURE.items()
                       if figure.per_class)
"""The alerts that read a class's TTFT or TBT P99."""
DEPLOYMENT = (NAMESPACE_LABEL, DEPLOYMENT_LABEL)
ENFORCED_LABEL = "namespace"
"""The namespace label the rules compare unless told another: prometheus-operator's
usual ``enforcedNamespaceLabel``. Compared where no Prometheus enforces one too: a
deployment's alerts then all carry the same value of it (the operator's
``SLOPILOT_NAMESPACE_LABEL`` stamps the rules with their namespace) or none (the rules
aggregate it away, and a label absent from both alerts is equal)."""


class MatchType(enum.StrEnum):
    EQUAL = "="
    REGEX = "=~"


@dataclass(frozen=True, slots=True)
class Matcher:
    """``label op value``, as Alertmanager matches an alert's labels (a regex anchored)."""

    label: str
    op: MatchType
    value: str

    def matches(self, labels: dict[str, str]) -> bool:
        got = labels.get(self.label, "")
        if self.op is MatchType.EQUAL:
            return got == self.value
        return re.fullmatch(self.value, got) is not None

    def text(self) -> str:
        """Alertmanager's ``source_matchers`` form: ``label="value"``."""
        escaped = self.value.replace("\\", "\\\\").replace('"', '\\"')
        return f'{self.label}{self.op.value}"{escaped}"'


@dataclass(frozen=True, slots=True)
class Inhibition:
    """Alerts matching ``target`` are silenced while one matching ``source`` fires with
    the same values of ``equal`` (a label absent from both is equal: the demo's rules
    carry no namespace)."""

    source: tuple[Matcher, ...]
    target: tuple[Matcher, ...]
    equal: tuple[str, ...]

    def inhibits(self, source: dict[str, str], target: dict[str, str]) -> bool:
        return (all(m.matches(source) for m in self.source)
                and all(m.matches(target) for m in self.target)
                and all(source.get(k, "") == target.get(k, "") for k in self.equal))


def _one_of(names: tuple[AlertName, ...]) -> Matcher:
    return Matcher("alertname", MatchType.REGEX, "|".join(n.value for n in names))


def inhibitions(namespace_label: str = ENFORCED_LABEL) -> tuple[Inhibition, ...]:
    """The inhibit rules, from the table's names; ``namespace_label`` the Prometheus's
    enforced namespace label (a RuleError where it cannot be one)."""
    deployment = (*DEPLOYMENT, check_namespace_label(namespace_label))
    every = tuple(AlertName)
    return (
        Inhibition((_one_of(BLINDING_ALERTS),), (_one_of(LATENCY_ALERTS),), deployment),
        Inhibition((_one_of(every), Matcher("severity", MatchType.EQUAL,
                                            Severity.CRITICAL.value)),
                   (_one_of(every), Matcher("severity", MatchType.EQUAL,
                                            Severity.WARNING.value)),
                   ("alertname", "priority_class", *deployment)),
    )


def alertmanager_rules(namespace_label: str = ENFORCED_LABEL) -> list[dict[str, Any]]:
    """``inhibit_rules`` entries of a plain ``alertmanager.yml``."""
    return [{"source_matchers": [m.text() for m in rule.source],
             "target_matchers": [m.text() for m in rule.target],
             "equal": list(rule.equal)} for rule in inhibitions(namespace_label)]


def alertmanager_yaml(namespace_label: str = ENFORCED_LABEL) -> str:
    return yaml.safe_dump({"inhibit_rules": alertmanager_rules(namespace_label)},
                          sort_keys=False, width=100)


def _crd_matchers(matchers: tuple[Matcher, ...]) -> list[dict[str, str]]:
    return [{"name": m.label, "value": m.value, "matchType": m.op.value} for m in matchers]


def alertmanager_config(namespace_label: str = ENFORCED_LABEL) -> dict[str, Any]:
    """The prometheus-operator AlertmanagerConfig holding the same rules (no route: it
    only inhibits). No namespace: it is applied where the Alertmanager selects it."""
    return {"apiVersion": "monitoring.coreos.com/v1alpha1", "kind": "AlertmanagerConfig",
            "metadata": {"name": "slopilot-inhibit-rules",
                         "labels": {"app.kubernetes.io/name": "slopilot"}},
            "spec": {"inhibitRules": [{"sourceMatch": _crd_matchers(rule.source),
                                       "targetMatch": _crd_matchers(rule.target),
                                       "equal": list(rule.equal)}
                                      for rule in inhibitions(namespace_label)]}}


MANIFEST_HEADER = (
    "# Generated by `python -m slopilot.tuner.prometheus.inhibitions` from the alert table.\n"
    "# Do not edit: tests/tuner/test_inhibitions.py checks it equals the rendering.\n"
    "# Apply where your Alertmanager selects AlertmanagerConfigs (docs/operations.md,\n"
    "# Alerts: one page per fault).\n")


def render_manifest(namespace_label: str = ENFORCED_LABEL) -> str:
    return MANIFEST_HEADER + yaml.safe_dump(alertmanager_config(namespace_label),
                                            sort_keys=False, width=100)


def manifest_path() -> Path:
    return (Path(__file__).resolve().parents[3] / "manifests" / "prometheus"
            / "slopilot-inhibit-rules.yaml")


def main(argv: Sequence[str] | None = None) -> int:
    """Regenerate the Alertmanager inhibitions manifest, once the arguments parse."""
    parser = argparse.ArgumentParser(
        prog="python -m slopilot.tuner.prometheus.inhibitions",
        description=f"Write the Alertmanager inhibit rules {manifest_path()}, rendered "
        "from the inhibitions table.")
    parser.add_argument(
        "--namespace-label", default=ENFORCED_LABEL, metavar="LABEL",
        help="your Prometheus's enforcedNamespaceLabel, compared so that an alert forged "
        "in another namespace silences nothing (default: %(default)s)")
    parser.add_argument(
        "--print", dest="to_stdout", choices=("manifest", "alertmanager.yml"),
        help="print the AlertmanagerConfig or the plain inhibit_rules instead of writing "
        "the repository's manifest (for a --namespace-label of your own)")
    args = parser.parse_args(argv)
    try:
        render = alertmanager_yaml if args.to_stdout == "alertmanager.yml" else render_manifest
        rendered = render(args.namespace_label)
    except RuleError as e:
        parser.error(f"--namespace-label: {e}")
    if args.to_stdout is not None:
        print(rendered, end="")
        return 0
    path = manifest_path()
    path.write_text(rendered)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
