"""Prometheus recording and alert rules rendered from a deployment's SLO.

One rule group per deployment: recording rules first, then the alerts that read them, so
one evaluation sees fresh values (Prometheus runs a group's rules in order). Every
recorded series carries ``slopilot_deployment`` so that several deployments can share
one Prometheus; the ``selector`` says which scraped series belong to the deployment.

Alerts carry ``action`` for the controller: ``scale`` (TBT far over its SLO: no knob
fixes a saturated replica), ``retune`` (TTFT, preemption storms, idle batching) or
``inform`` (prefix hits low: the workload changed, not the knobs).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.utils import floatToGoString

from slopilot.engine.metrics import LATENCY_BUCKETS
from slopilot.engine.slo import SLOSpec

_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
DEPLOYMENT_LABEL = "slopilot_deployment"
ALL_CLASSES = "all"
EXAMPLE_DEPLOYMENT = "example"


class RuleError(ValueError):
    """Rule rendering was given a bad name, selector or timing; the message names the fix."""


@dataclass(frozen=True, slots=True)
class RuleOptions:
    """Timing and fixed thresholds of the rules (the SLO gives the rest)."""

    interval_s: int = 30
    """Group evaluation interval: also the unit of the TBT alert's 'for'."""
    rate_window_s: int = 60
    """Window of every rate() (at least two scrapes)."""
    alert_for_s: int = 120
    """How long a condition must hold before an alert fires (TBT: see tbt_periods)."""
    tbt_periods: int = 3
    """The TBT alert fires after this many evaluation periods over 2 x SLO."""
    busy_ratio_min: float = 0.6
    waiting_min: int = 100

    def __post_init__(self) -> None:
        for name in ("interval_s", "rate_window_s", "tbt_periods"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise RuleError(f"{name}={value!r}: expected a whole number >= 1")
        if isinstance(self.alert_for_s, bool) or not isinstance(self.alert_for_s, int) \
                or self.alert_for_s < 0:
            raise RuleError(f"alert_for_s={self.alert_for_s!r}: expected whole seconds >= 0")
        if not 0 < self.busy_ratio_min <= 1:
            raise RuleError(f"busy_ratio_min={self.busy_ratio_min!r}: expected a ratio in (0, 1]")
        if self.waiting_min < 0:
            raise RuleError(f"waiting_min={self.waiting_min!r}: expected a count >= 0")


def duration(seconds: int) -> str:
    """Prometheus duration text: whole minutes as 'Nm', the rest as 'Ns'."""
    return f"{seconds // 60}m" if seconds and seconds % 60 == 0 else f"{seconds}s"


def _num(x: float) -> str:
    return f"{x:g}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render_selector(labels: Mapping[str, str]) -> str:
    """``{a="x",b="y"}`` from a label map, names checked and values escaped."""
    parts = []
    for name, value in labels.items():
        if not _LABEL_NAME.match(name):
            raise RuleError(f"selector label {name!r} is not a Prometheus label name; "
                            "use letters, digits and underscores, not starting with a digit")
        parts.append(f'{name}="{_escape(str(value))}"')
    return "{" + ",".join(parts) + "}"


def bucket_edge_at_or_below(threshold_s: float) -> float:
    """The latency bucket edge whose count means 'met the SLO' (conservative if off-grid)."""
    below = [e for e in LATENCY_BUCKETS if e <= threshold_s + 1e-12]
    return below[-1] if below else LATENCY_BUCKETS[0]


def _le(edge: float) -> str:
    # The text prometheus_client writes for le: 1 -> "1.0", 0.1 -> "0.1".
    return str(floatToGoString(edge))


class _Renderer:
    def __init__(self, spec: SLOSpec, deployment: str, selector: Mapping[str, str] | None,
                 options: RuleOptions) -> None:
        if not isinstance(deployment, str) or not deployment.strip():
            raise RuleError("deployment name is empty; pass the LLMDeployment's name")
        self.spec, self.deployment, self.opt = spec, deployment, options
        sel = dict(selector) if selector is not None else {DEPLOYMENT_LABEL: deployment}
        if not sel:
            raise RuleError("selector is empty: it would match every engine in Prometheus; "
                            f"pass labels such as {{'{DEPLOYMENT_LABEL}': '{deployment}'}}")
        self.sel_labels = sel
        render_selector(sel)  # validates names
        self.window = duration(options.rate_window_s)
        self.dep = {DEPLOYMENT_LABEL: deployment}

    def sel(self, **extra: str) -> str:
        return render_selector({**self.sel_labels, **extra})

    def rec(self, name: str, **extra: str) -> str:
        return name + render_selector({**self.dep, **extra})

    def record(self, name: str, expr: str, **labels: str) -> dict[str, Any]:
        return {"record": name, "expr": expr, "labels": {**self.dep, **labels}}

    def alert(self, name: str, expr: str, for_s: int, severity: str, action: str,
              priority_class: str, summary: str, description: str) -> dict[str, Any]:
        return {"alert": name, "expr": expr, "for": duration(for_s),
                "labels": {"severity": severity, "action": action,
                           "priority_class": priority_class, **self.dep},
                "annotations": {"summary": summary, "description": description}}

    def quantile(self, q: float, metric: str) -> str:
        return (f"histogram_quantile({q}, sum by (le, priority_class) "
                f"(rate({metric}_bucket{self.sel()}[{self.window}])))")

    def fraction_within(self, metric: str, cls: str, threshold_s: float) -> str:
        within = self.sel(priority_class=cls, le=_le(bucket_edge_at_or_below(threshold_s)))
        return (f"sum by (priority_class) (rate({metric}_bucket{within}"
                f"[{self.window}])) / sum by (priority_class) "
                f"(rate({metric}_count{self.sel(priority_class=cls)}[{self.window}]))")

    def recording_rules(self) -> list[dict[str, Any]]:
        w = self.window
        rules = []
        for short, metric in (("ttft", "vllm:time_to_first_token_seconds"),
                              ("tbt", "vllm:inter_token_latency_seconds")):
            for q, tag in ((0.99, "p99"), (0.5, "p50")):
                rules.append(self.record(f"slopilot:{short}_seconds:{tag}",
                                         self.quantile(q, metric)))
        rules += [
            self.record("slopilot:preemptions:per_minute",
                        f"sum(rate(vllm:num_preemptions_total{self.sel()}[{w}])) * 60"),
            self.record("slopilot:busy_ratio:avg", f"avg(slopilot_busy_ratio{self.sel()})"),
            self.record("slopilot:num_requests_waiting:sum",
                        f"sum(vllm:num_requests_waiting{self.sel()})"),
            self.record("slopilot:prefix_cache_hit_ratio",
                        f"sum(rate(vllm:prefix_cache_hits_total{self.sel()}[{w}])) / "
                        f"sum(rate(vllm:prefix_cache_queries_total{self.sel()}[{w}]))"),
            self.record("slopilot:generation_tokens:per_second",
                        f"sum(rate(vllm:generation_tokens_total{self.sel()}[{w}]))"),
        ]
        for p, slo in self.spec.classes().items():
            # Goodput-ish: finished tokens times the fractions of first tokens and gaps
            # inside the SLO (a product, as if independent; exact where all or none pass).
            expr = (f"sum by (priority_class) (rate(vllm:request_generation_tokens_sum"
                    f"{self.sel(priority_class=p.label)}[{w}]))")
            if slo.ttft_p99_ms is not None:
                expr += " * (" + self.fraction_within(
                    "vllm:time_to_first_token_seconds", p.label, slo.ttft_p99_ms / 1000) + ")"
            if slo.tbt_p99_ms is not None:
                expr += " * (" + self.fraction_within(
                    "vllm:inter_token_latency_seconds", p.label, slo.tbt_p99_ms / 1000) + ")"
            # The class label keeps promtool's duplicate-rule lint apart.
            rules.append(self.record("slopilot:goodput_tokens:per_second", expr,
                                     priority_class=p.label))
        return rules

    def alert_rules(self) -> list[dict[str, Any]]:
        o, dep = self.opt, self.deployment
        rules = []
        for p, slo in self.spec.classes().items():
            c = p.label
            if slo.tbt_p99_ms is not None:
                limit = 2 * slo.tbt_p99_ms / 1000
                rules.append(self.alert(
                    "SlopilotTBTP99High",
                    f"{self.rec('slopilot:tbt_seconds:p99', priority_class=c)} > {_num(limit)}",
                    o.tbt_periods * o.interval_s, "critical", "scale", c,
                    f"{dep}: {c.upper()} TBT P99 over twice its SLO",
                    f"{c.upper()} time between tokens P99 is {{{{ $value | humanizeDuration }}}}"
                    f", over 2 x the {_num(slo.tbt_p99_ms)} ms SLO: add replicas."))
            if slo.ttft_p99_ms is not None:
                for factor, severity in ((1, "warning"), (2, "critical")):
                    limit = factor * slo.ttft_p99_ms / 1000
                    over = "over its SLO" if factor == 1 else "over twice its SLO"
                    rules.append(self.alert(
                        "SlopilotTTFTP99High",
                        f"{self.rec('slopilot:ttft_seconds:p99', priority_class=c)}"
                        f" > {_num(limit)}",
                        o.alert_for_s, severity, "retune", c,
                        f"{dep}: {c.upper()} TTFT P99 {over}",
                        f"{c.upper()} time to first token P99 is "
                        f"{{{{ $value | humanizeDuration }}}}, {over} of "
                        f"{_num(slo.ttft_p99_ms)} ms: retune the token budget and chunk size."))
        limit_pm = self.spec.max_preemptions_per_min
        if limit_pm is not None:
            rules.append(self.alert(
                "SlopilotPreemptionStorm",
                f"{self.rec('slopilot:preemptions:per_minute')} > {_num(limit_pm)}",
                o.alert_for_s, "warning", "retune", ALL_CLASSES,
                f"{dep}: preemption storm",
                f"{{{{ $value | printf \"%.1f\" }}}} preemptions per minute, over the limit "
                f"of {_num(limit_pm)}: retune the preemption thresholds or the KV watermark."))
        rules.append(self.alert(
            "SlopilotBatchingUnderused",
            f"{self.rec('slopilot:busy_ratio:avg')} < {_num(o.busy_ratio_min)} "
            f"and on ({DEPLOYMENT_LABEL}) "
            f"{self.rec('slopilot:num_requests_waiting:sum')} > {o.waiting_min}",
            o.alert_for_s, "warning", "retune", ALL_CLASSES,
            f"{dep}: batching underused while requests wait",
            f"The executor is busy {{{{ $value | humanizePercentage }}}} of the time while "
            f"more than {o.waiting_min} requests wait: raise the token budget or max_num_seqs."))
        hit_min = self.spec.prefix_hit_min
        if hit_min is not None:
            rules.append(self.alert(
                "SlopilotPrefixCacheHitLow",
                f"{self.rec('slopilot:prefix_cache_hit_ratio')} < {_num(hit_min)}",
                o.alert_for_s, "info", "inform", ALL_CLASSES,
                f"{dep}: prefix cache hit ratio low",
                f"Prefix cache hit ratio is {{{{ $value | humanizePercentage }}}}, under the "
                f"expected {_num(hit_min)}: the traffic may no longer share prefixes."))
        return rules


def render_rule_groups(spec: SLOSpec, deployment: str, *,
                       selector: Mapping[str, str] | None = None,
                       options: RuleOptions | None = None) -> dict[str, Any]:
    """The plain rules file content: ``{"groups": [...]}``."""
    opts = options if options is not None else RuleOptions()
    r = _Renderer(spec, deployment, selector, opts)
    group = {"name": f"slopilot-{deployment}", "interval": duration(opts.interval_s),
             "rules": r.recording_rules() + r.alert_rules()}
    return {"groups": [group]}


def render_rules_yaml(spec: SLOSpec, deployment: str, *,
                      selector: Mapping[str, str] | None = None,
                      options: RuleOptions | None = None) -> str:
    groups = render_rule_groups(spec, deployment, selector=selector, options=options)
    return yaml.safe_dump(groups, sort_keys=False, width=100)


def render_prometheus_rule(spec: SLOSpec, deployment: str, namespace: str, *,
                           selector: Mapping[str, str] | None = None,
                           options: RuleOptions | None = None,
                           labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The same groups as a prometheus-operator PrometheusRule custom resource."""
    if not namespace:
        raise RuleError("namespace is empty; pass the deployment's namespace")
    groups = render_rule_groups(spec, deployment, selector=selector, options=options)
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": f"slopilot-{deployment}", "namespace": namespace,
                     "labels": {"app.kubernetes.io/managed-by": "slopilot",
                                "slopilot.dev/deployment": deployment, **(labels or {})}},
        "spec": groups,
    }


def example_spec() -> SLOSpec:
    """The checked-in example: standard profile, prefix caching expected (chat)."""
    return SLOSpec.from_dict({"profile": "standard", "prefix_hit_min": 0.95})


EXAMPLE_HEADER = (
    "# Generated by `python -m slopilot.tuner.prometheus.rules` from the standard SLO profile\n"
    "# with prefix caching expected (prefix_hit_min 0.95), for deployment \"example\".\n"
    "# Do not edit: tests/tuner/test_rules.py checks it equals the rendering.\n")


def render_example() -> str:
    return EXAMPLE_HEADER + render_rules_yaml(example_spec(), EXAMPLE_DEPLOYMENT)


def example_path() -> Path:
    return Path(__file__).resolve().parents[3] / "manifests" / "prometheus" / "slopilot-rules.yaml"


if __name__ == "__main__":
    path = example_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_example())
    print(f"wrote {path}")
