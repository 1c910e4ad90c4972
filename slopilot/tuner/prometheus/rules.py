"""Prometheus recording and alert rules rendered from a deployment's SLO.

One rule group per deployment: recording rules first, then the alerts that read them, so
one evaluation sees fresh values (Prometheus runs a group's rules in order). The alerts
are the rows of ``alert_table`` (its docstring has the table and the ``for`` semantics),
rendered here as PromQL over the recorded series.

A deployment is its namespace *and* its name: two LLMDeployments named ``chat`` in
``team-a`` and ``team-b`` are two deployments to every selector, recorded series and alert.
Every recorded series and alert carries the identity labels ``slopilot_namespace`` (when
the deployment has a namespace; the one-machine demo has none) and ``slopilot_deployment``;
the ``selector`` says which scraped series belong to the deployment (by default the same
labels, which the operator's ServiceMonitor puts on every series it scrapes).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.utils import floatToGoString

from slopilot.engine.histogram_quantiles import EDGE_TOLERANCE, inside, straddled
from slopilot.engine.slo import WITHIN_TTFT_TARGET, SLOSpec
from slopilot.engine.verdicts import SLO_TOKENS
from slopilot.tuner.prometheus.alert_table import (
    ACTING,
    ALL_CLASSES,
    AlertAdvice,
    AlertContext,
    AlertRule,
    Figure,
    RuleError,
    RuleOptions,
    alert_table,
    latency_thresholds,
)
from slopilot.tuner.prometheus.latency_sources import (
    BUILTIN_LATENCY,
    TTFT,
    VLLM_LATENCY,
    VLLM_LATENCY_BUCKETS,
    Histogram,
    LatencySource,
    LatencySources,
)
from slopilot.tuner.prometheus.objectives import objectives

__all__ = ["ALL_CLASSES", "BUILTIN_LATENCY", "DEPLOYMENT_LABEL", "NAMESPACE_LABEL", "TTFT",
           "VLLM_LATENCY", "VLLM_LATENCY_BUCKETS", "LatencySources", "RuleError",
           "RuleOptions", "duration", "identity_labels", "latency_quantile",
           "render_prometheus_rule", "render_rule_groups", "render_rules_yaml",
           "render_selector"]

_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
DEPLOYMENT_LABEL = "slopilot_deployment"
NAMESPACE_LABEL = "slopilot_namespace"
REPLICA_LABEL = "instance"
"""What tells one replica's series from another's: the target Prometheus scraped, on
every series it scrapes (a pod's address under the ServiceMonitor, the demo's too)."""
EXAMPLE_DEPLOYMENT = "example"
DCGM_GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"


def identity_labels(deployment: str, namespace: str | None = None,
                    namespace_label: str | None = None) -> dict[str, str]:
    """The labels that say whose a series or an alert is: namespace (if any) and name.

    ``namespace_label``: the label a prometheus-operator stamps with the namespace of the
    object a series or a rule came from (its Prometheus's ``enforcedNamespaceLabel``); it
    then holds the namespace too. The ``slopilot_*`` labels are whatever a rule or a scrape
    says, so a tenant who may write PrometheusRules or monitors could put another
    namespace's there; the enforced one no tenant can write.
    """
    if not isinstance(deployment, str) or not deployment.strip():
        raise RuleError("deployment name is empty; pass the LLMDeployment's name")
    if namespace is not None and (not isinstance(namespace, str) or not namespace.strip()):
        raise RuleError("namespace is empty; pass the deployment's namespace, or None for "
                        "a deployment outside Kubernetes")
    labels = {} if namespace is None else {NAMESPACE_LABEL: namespace}
    if namespace_label is not None and namespace is not None:
        labels[check_namespace_label(namespace_label)] = namespace
    return {**labels, DEPLOYMENT_LABEL: deployment}


# Labels the rules, the alerts and the controller's reads give a meaning of their own.
_TAKEN_LABELS = frozenset({NAMESPACE_LABEL, DEPLOYMENT_LABEL, "priority_class", "alertname",
                           "alertstate", "severity", "action", "le", "pod", "job",
                           "instance"})


def check_namespace_label(name: str) -> str:
    """``name`` if it can be the enforced namespace label, else a RuleError saying why."""
    if not isinstance(name, str) or not _LABEL_NAME.fullmatch(name) or name.startswith("__"):
        raise RuleError(f"namespace label {str(name)[:60]!r} is not a Prometheus label "
                        "name; use the Prometheus's enforcedNamespaceLabel, e.g. namespace")
    if name in _TAKEN_LABELS:
        raise RuleError(f"namespace label {name!r} is a label slopilot's series already "
                        "use; use the Prometheus's enforcedNamespaceLabel, e.g. namespace")
    return name


def duration(seconds: int) -> str:
    """Prometheus duration text: whole minutes as 'Nm', the rest as 'Ns'."""
    return f"{seconds // 60}m" if seconds and seconds % 60 == 0 else f"{seconds}s"


def _num(x: float) -> str:
    """A threshold as PromQL text that reads back to the very float the Python side
    compares with (``:g`` would round 0.0666... to 6 digits and split the verdicts)."""
    x = float(x)
    return str(int(x)) if x.is_integer() and abs(x) < 1e15 else repr(x)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render_selector(labels: Mapping[str, str]) -> str:
    """``{a="x",b="y"}`` from a label map, names checked and values escaped."""
    parts = []
    for name, value in labels.items():
        if not _LABEL_NAME.fullmatch(name):
            raise RuleError(f"selector label {name!r} is not a Prometheus label name; "
                            "use letters, digits and underscores, not starting with a digit")
        parts.append(f'{name}="{_escape(str(value))}"')
    return "{" + ",".join(parts) + "}"


def _summed_rates(metrics: tuple[str, ...], selector: str, window: str, others: str,
                  fn: str = "rate") -> str:
    """The rates of ``metrics`` under ``selector``, each summed by ``others`` (every label
    but ``le``), added where several have the group and one alone where the others do
    not: one of them absent leaves the others read. (One selector of several names would
    not do: ``rate`` drops the name, and two series left with one label set are an error.)
    """
    terms = [f"sum by ({others}) ({fn}({m}{selector}[{window}]))" if others
             else f"sum({fn}({m}{selector}[{window}]))" for m in metrics]
    if len(terms) == 1:
        return terms[0]
    return "(" + " + ".join(terms) + " or " + " or ".join(terms) + ")"


def _others(by: str) -> str:
    return ", ".join(label for label in by.replace(" ", "").split(",") if label != "le")


def _narrowed(selector: str, matcher: str) -> str:
    """``selector`` (``{...}`` text) with ``matcher`` added."""
    inner = selector.strip().removeprefix("{").removesuffix("}").strip()
    return "{" + (f"{inner},{matcher}" if inner else matcher) + "}"


def _missed_only(selector: str) -> str:
    """``selector`` narrowed to the first tokens never given that missed the target: a
    client gone within its TTFT target missed nothing (``WITHIN_TTFT_TARGET``). A series
    without the label (refusals; an image from before it) matches, as it always did."""
    return _narrowed(selector, f'{WITHIN_TTFT_TARGET}!="true"')


def bucket_rates(hist: Histogram, selector: str, window: str,
                 by: str = "le, priority_class", rates: str | None = None) -> str:
    """The rates of ``hist``'s buckets, summed ``by`` (``le`` among them), as
    ``histogram_quantile`` takes them. A request that never got a first token (turned
    away for load, 429; or its client left before it after waiting past its TTFT target:
    a stall's queue) is counted in the +Inf bucket beside the served ones, from the
    counters ``hist.never`` names; a client that left within its target missed nothing,
    and is not. So is one still waiting for it at the window's end past its target
    (``hist.waiting``'s gauges as they stand then, over the window's seconds: a class
    starved of first tokens). None of those series (an image from before them): the
    buckets as they are. ``rates``: the buckets' rates per replica, not summed
    (``judged_rates``); None, as each replica exports them."""
    rates = rates or f"rate({hist.metric}_bucket{selector}[{window}])"
    buckets = f"sum by ({by}) ({rates})"
    never = _never(hist, selector, window, _others(by), "rate")
    if never is None:
        return buckets
    return (f'({buckets} + on ({by}) label_replace({never}, "le", "+Inf", "", "") '
            f"or {buckets})")


def _never(hist: Histogram, selector: str, window: str, others: str, fn: str
           ) -> str | None:
    """The first tokens never given that ``hist``'s +Inf holds, summed by ``others``: the
    ``never`` counters' ``fn`` (rate or increase) and, where they miss their target,
    the ``waiting`` gauges as they stand at the window's end (over its seconds for a
    rate)."""
    missed = _missed_only(selector)
    terms = []
    if hist.never:
        terms.append(_summed_rates(hist.never, missed, window, others, fn))
    # A dashboard's range is Grafana's to choose (``$__rate_interval``), in no seconds
    # PromQL can divide by: its panels rank the first tokens never given alone, as before.
    waiting = () if window.startswith("$") else hist.waiting
    for gauge in waiting:
        per = "" if fn == "increase" else f" / {_seconds(window)}"
        # As it stands at the window's end (an instant selector): a replica gone before
        # it (scaled down, evicted) has its series marked stale, and its clients, who
        # retried elsewhere, are not read as waiting on; its last gauge over the window
        # ranked them as first tokens never given.
        last = f"{gauge}{missed}"
        terms.append((f"sum by ({others}) ({last})" if others else f"sum({last})") + per)
    if not terms:
        return None
    out = terms[0]
    for term in terms[1:]:
        # One absent leaves the other read (``_summed_rates``), pair by pair.
        out = f"({out} + {term} or {out} or {term})"
    return out


def _seconds(window: str) -> int:
    """The seconds of a ``duration`` text ('2m', '90s')."""
    return int(window[:-1]) * (60 if window.endswith("m") else 1)


def judged_buckets(hist: Histogram, selector: str, window: str, by: str,
                   thresholds: Mapping[str, Sequence[float]]) -> str:
    """``bucket_rates``, read so that a quantile claims no threshold breached that the
    buckets cannot prove, and a sum over replicas with different edges stays one
    histogram: ``judged_rates`` at every threshold of every class (``thresholds``, in
    seconds), whatever the quantile's class or ``by``. A histogram whose edges hold
    every threshold (the built-in engine's and the meter's, under the profiles) is read
    as it is."""
    values = [t for ts in thresholds.values() for t in ts]
    return bucket_rates(hist, selector, window, by,
                        judged_rates(hist.metric, hist.edges, selector, window, values))


def judged_rates(metric: str, edges: Sequence[float], selector: str, window: str,
                 thresholds: Iterable[float]) -> str:
    """The rates of ``metric``'s buckets over ``window``, replica by replica (not
    summed), each read as its own edges allow at every one of ``thresholds``: the one
    construction every quantile or share summed over replicas reads.

    For each threshold ``T`` strictly inside a bucket ``(lo, hi]`` of the fixed
    ``edges`` (``histogram_quantiles.inside``), a replica's own series at ``le = T``
    (its process started with the SLO: ``latency_buckets.slo_edges``) is read as it is
    where it covers the same samples as its series at ``hi`` over the window; else
    (none: the process started before the SLO was edited; or only part of the window:
    restarted in place, same labels, since the edit) its series at ``hi`` is copied to
    ``le = T``. ``histogram_quantile`` then spreads that replica's bucket over
    ``(lo, T]``, as if none were above ``T``, which its counts cannot tell; so a
    quantile reads above ``T`` where more than ``1 - q`` of that replica's
    observations are above ``hi`` (a breach proven), or, on its own edge, above ``T``.
    Summed, every replica has a series at every ``T``, so the sum is a histogram: one
    replica's own series at ``T`` beside another's copy, never beside nothing."""
    every = f"rate({metric}_bucket{selector}[{window}])"
    copies = []
    for hi, t in inside(edges, thresholds):
        every = f"{every} unless ({_partial_edge(metric, selector, window, hi, t)})"
        copies.append(_edge_copy(metric, selector, window, hi, t))
    # ``or`` keeps every series as it is and adds a copy only where no series of its
    # labels is left: one copy per replica and threshold, never a second series at T.
    # (``unless`` binds tighter than ``or``.)
    return " or ".join([every, *copies])


def _partial_edge(metric: str, selector: str, window: str, hi: float, t: float) -> str:
    """A replica's series at ``le = t`` where it holds other samples over ``window``
    than its series at ``hi``: it began or ended inside it (a restart in place, same
    labels, since an edit of the SLO). Read as it is, its count at ``t`` stood below the
    one at the edge under it, Prometheus raised it, and a P99 of first tokens all at
    795 ms read 830 ms over an 800 ms SLO. A replica whose series all began together
    (new in the window) has none here."""
    at_t, at_hi = (_narrowed(selector, f'le="{_le(e)}"') for e in (t, hi))
    # A comparison ``ignoring (le)`` drops ``le``: put it back, so that ``unless`` drops
    # that replica's series at ``t`` alone, not its every bucket.
    return (f"label_replace(count_over_time({metric}_bucket{at_t}[{window}]) "
            f"!= ignoring (le) count_over_time({metric}_bucket{at_hi}[{window}]), "
            f'"le", "{_le(t)}", "", "")')


def _edge_copy(metric: str, selector: str, window: str, hi: float, t: float) -> str:
    """Each replica's rate at ``hi`` renamed ``le = t``: its bucket read as if none of it
    lay above ``t`` (``judged_rates``)."""
    at_hi = _narrowed(selector, f'le="{_le(hi)}"')
    edge = _escape(re.escape(_le(hi)))
    return (f'label_replace(rate({metric}_bucket{at_hi}[{window}]), "le", "{_le(t)}", '
            f'"le", "{edge}")')


def latency_quantile(q: float, source: LatencySource, selector: str, window: str,
                     by: str = "le, priority_class",
                     thresholds: Mapping[str, Sequence[float]] | None = None) -> str:
    """``q`` of a TTFT or TBT over ``window``, summed ``by`` (``le`` among them): the
    client-side histogram's wherever it observed a first token in the window, else the
    engine's (``latency_sources``), each with the first tokens never given in its +Inf
    (``bucket_rates``): a stall reads the last finite edge of the histogram read, 300 s
    on the built-in engine's and the meter's, 2,560 s on vLLM's own (read for a class
    whose meter saw no first token in the window, as in a stall that gives none).
    ``thresholds``: per class, what the quantile is judged against; each histogram's
    buckets are read so that none is claimed breached where its edges cannot prove it
    (``judged_buckets``: on vLLM's own, the standard profile's P0 TBT SLO falls inside
    (10, 25] ms). Per group of
    ``by``: the guard keeps a group whose client histogram counted nothing (its quantile
    NaN) from hiding the engine's, and ``or`` takes the engine's for a group only where
    the client's has none of the same labels.
    """
    limits = thresholds or {}
    own = (f"histogram_quantile({q}, "
           f"{judged_buckets(source.engine, selector, window, by, limits)})")
    if source.client is None:
        return own
    hist = source.client
    others = _others(by)
    # Its first tokens, not its streams cut short: a class whose clients ask for bodies
    # (the meter times streams only) is vLLM's, one stream cut short beside them counted
    # in vLLM's +Inf (``latency_sources``), not a class of that one stream alone.
    seen = _summed_rates((f"{hist.metric}_count",), selector, window, others) + " > 0"
    client = f"histogram_quantile({q}, {judged_buckets(hist, selector, window, by, limits)})"
    return f"({client} and on ({others}) ({seen})) or {own}"


def latency_count(source: LatencySource, selector: str, window: str,
                  by: str = "priority_class") -> str:
    """The observations ``latency_quantile`` ranks over ``window``, summed ``by`` (no
    ``le``): the same histogram's count (the client-side one wherever it observed a
    first token, else the engine's), with the first tokens never given that its +Inf
    holds. On vLLM a class whose clients mostly ask for bodies has its P99 from the
    meter's few streams, and that P99 rests on those, not on every request finished."""
    def counted(hist: Histogram) -> str:
        seen = f"sum by ({by}) (increase({hist.metric}_count{selector}[{window}]))"
        never = _never(hist, selector, window, by, "increase")
        if never is None:
            return seen
        return f"({seen} + on ({by}) {never} or {seen})"

    own = counted(source.engine)
    if source.client is None:
        return own
    seen = _summed_rates((f"{source.client.metric}_count",), selector, window, by) + " > 0"
    return f"({counted(source.client)} and on ({by}) ({seen})) or {own}"


def awaiting_count(source: LatencySource, selector: str, window: str,
                   by: str = "priority_class") -> str | None:
    """The requests given no first token yet at the end of ``window``, within their TTFT
    target or past it, summed ``by``: the ``waiting`` gauges of the TTFT histograms,
    as they stand then (``ClassFigures.requests_awaiting``); None where they name none."""
    names = dict.fromkeys(g for hist in (source.engine, source.client) if hist is not None
                          for g in hist.waiting)
    if not names:
        return None
    # As the gauges stand at the window's end, as ``_never`` reads them: a replica gone
    # before it holds none.
    terms = [f"sum by ({by}) ({g}{selector})" for g in names]
    out = terms[0]
    for term in terms[1:]:
        out = f"({out} + {term} or {out} or {term})"
    return out


def _le(edge: float) -> str:
    # The text prometheus_client writes for le: 1 -> "1.0", 0.1 -> "0.1".
    return str(floatToGoString(edge))


class _Renderer:
    def __init__(self, spec: SLOSpec, deployment: str, namespace: str | None,
                 selector: Mapping[str, str] | None, options: RuleOptions,
                 namespace_label: str | None = None,
                 latency: LatencySources = BUILTIN_LATENCY, *,
                 dcgm_namespace: str | None = None,
                 advice: AlertAdvice = ACTING) -> None:
        self.spec, self.opt = spec, options
        self.latency, self.advice = latency, advice
        self.ident = identity_labels(deployment, namespace, namespace_label)
        if dcgm_namespace is not None and (not isinstance(dcgm_namespace, str)
                                           or not dcgm_namespace.strip()):
            raise RuleError(f"dcgm_namespace={dcgm_namespace!r} is empty; pass the "
                            "namespace the DCGM exporter runs in, or None to read its "
                            "series only where they are scraped with honorLabels")
        self.dcgm_namespace = dcgm_namespace
        self.subject = deployment if namespace is None else f"{namespace}/{deployment}"
        self.deployment, self.namespace = deployment, namespace
        sel = dict(selector) if selector is not None else dict(self.ident)
        if not sel:
            raise RuleError("selector is empty: it would match every engine in Prometheus; "
                            f"pass labels such as {self.ident}")
        self.sel_labels = sel
        render_selector(sel)  # validates names
        self.window = duration(options.rate_window_s)
        # What each class's P99s are judged against, from the alert table itself.
        self.thresholds = {source: latency_thresholds(spec, options, ttft=ttft)
                           for source, ttft in ((latency.ttft, True), (latency.tbt, False))}

    def sel(self, **extra: str) -> str:
        return render_selector({**self.sel_labels, **extra})

    def rec(self, name: str, **extra: str) -> str:
        return name + render_selector({**self.ident, **extra})

    def record(self, name: str, expr: str, **labels: str) -> dict[str, Any]:
        return {"record": name, "expr": expr, "labels": {**self.ident, **labels}}

    def quantile(self, q: float, source: LatencySource, window: str | None = None) -> str:
        """``q`` of ``source`` per class, read at every class's thresholds
        (``judged_buckets``): a P99 claims no breach its buckets cannot prove, and
        every quantile reads a fleet of replicas started with and before an SLO edit
        as one histogram."""
        return latency_quantile(q, source, self.sel(), window or self.window,
                                thresholds=self.thresholds[source])

    def fraction_within(self, metric: str, cls: str, threshold_s: float,
                        by: str = "priority_class") -> str:
        """The share of ``metric``'s observations of class ``cls`` at or under the
        threshold, per ``by``; 1 where there are none in the window (one-token requests
        have no gaps; a long one's first token fell before it), not 0/0. Off the
        backend's grid, the share at or under the first edge above the threshold: the
        bucket that holds it counted as within, as a P99 read there claims no breach
        (``judged_buckets``). Spread evenly over (10, 25] ms, vLLM's gaps all at 12 ms
        read a third over a 20 ms SLO, and the goodput a third low; counted so, gaps
        at 22 ms read as met, which vLLM's buckets cannot tell from 12. An edge a
        backend does not export selects nothing, so only its own are read; a replica
        that exports the threshold itself (started with this SLO:
        ``latency_buckets.slo_edges``) is read on it, exactly."""
        edges = sorted(self.latency.edges(metric))

        def rate(le: float) -> str:
            return (f"rate({metric}_bucket"
                    f"{self.sel(priority_class=cls, le=_le(le))}[{self.window}])")

        observed = (f"sum by ({by}) "
                    f"(rate({metric}_count{self.sel(priority_class=cls)}[{self.window}]))")
        count = f"({observed} > 0)"
        none = f" or ({observed} == 0) + 1"
        # On an edge, or the first above it; past the last one, the last.
        edge = next((e for e in edges if e >= threshold_s - EDGE_TOLERANCE), edges[-1])
        within = rate(edge)
        if straddled(edges, (threshold_s,)):
            # Replica by replica, as ``judged_rates``: its own series at the threshold
            # where it covers the window, else the edge above it renamed.
            own = self.sel(priority_class=cls)
            within = (f"({rate(threshold_s)} unless "
                      f"({_partial_edge(metric, own, self.window, edge, threshold_s)})) or "
                      f"{_edge_copy(metric, own, self.window, edge, threshold_s)}")
        return f"sum by ({by}) ({within}) / {count}{none}"

    def gpu_utilization(self) -> str:
        """DCGM's GPU utilization (percent) of the deployment's pods, as a ratio.

        The exporter names the pod using each GPU in ``namespace``/``pod`` where it is
        scraped with honorLabels (as its chart does), else in ``exported_namespace``/
        ``exported_pod``. The GPUs are joined on the pods the engine's own series come
        from; but those labels are also what any pod's own series may say, so only the
        exporter's series are read at all:

        - ``namespace`` the deployment's (and the enforced namespace label, where there
          is one): a tenant's pod scraped by the operator's ServiceMonitor (honorLabels
          false) carries its own namespace there, whatever its image wrote, which
          lands in ``exported_namespace``: read as the GPU's, that let one tenant set
          another's utilization, and so fire or hide its retune alert.
        - ``exported_*`` only under ``namespace`` = ``dcgm_namespace``, the namespace the
          administrator says the exporter runs in; None, never.
        - never a series with the operator's identity labels: an engine wrote it.

        Without a namespace (outside Kubernetes, one tenant) the join alone decides. No
        DCGM series for these pods: no sample, and the utilization falls back to the busy
        ratio.
        """
        not_an_engine = {NAMESPACE_LABEL: "", DEPLOYMENT_LABEL: ""}
        namespace = self.ident.get(NAMESPACE_LABEL)
        own: dict[str, str] = {}
        if namespace is not None:
            # The enforced label, where there is one, says the same namespace.
            own = {"namespace": namespace,
                   **{k: v for k, v in self.ident.items() if k not in not_an_engine}}
        gpus = [DCGM_GPU_UTIL + render_selector({**own, **not_an_engine})]
        if self.dcgm_namespace is not None:
            exported = {"namespace": self.dcgm_namespace}
            if namespace is not None:
                exported["exported_namespace"] = namespace
            dcgm = DCGM_GPU_UTIL + render_selector({**exported, **not_an_engine})
            for label in ("pod", "namespace"):
                dcgm = f'label_replace({dcgm}, "{label}", "$1", "exported_{label}", "(.+)")'
            gpus.append(dcgm)
        either = gpus[0] if len(gpus) == 1 else f"({' or '.join(gpus)})"
        pods = f"group by (namespace, pod) (vllm:num_requests_running{self.sel()})"
        return f"avg({either} * on (namespace, pod) group_left () {pods}) / 100"

    def busy_gauges(self) -> str:
        """The engine's requests running and waiting under the selector: one selector,
        so either alone (the other not exported) is read. Both backends export both."""
        return ('{__name__=~"vllm:num_requests_running|vllm:num_requests_waiting",'
                + self.sel()[1:])

    def stalled_replicas(self) -> str:
        """The replicas with requests waiting or running that made no token over the
        window (on vLLM: and with requests in flight at its meter, ``in_flight``): per
        replica, so one stuck among busy ones counts (the deployment's sum of
        tokens hid it, while its clients' first tokens never came). One that exports no
        token counter counts too: it makes none that anyone can see (both backends
        export it, at 0, from their start). 0, not no data, where none is stalled.

        A rate needs two samples in its window, and a scrape interval past half the
        window leaves one (Prometheus's default, 60 s, against the 60 s window): no rate
        is no verdict, not no token, or every busy replica read as stalled and the alert
        held the loop for good. Where the window holds too few, the replica is judged
        over ``RuleOptions.stall_lookback_s`` instead (a stall then reads later: its
        tokens flat that long), and where even that holds too few, it is not counted."""
        by = f"sum by ({REPLICA_LABEL})"
        busy = f"{by} ({self.busy_gauges()}) > 0"
        tokens = f"vllm:generation_tokens_total{self.sel()}"
        lookback = duration(self.opt.stall_lookback_s)
        short = f"{by} (rate({tokens}[{self.window}]))"
        long = f"{by} (rate({tokens}[{lookback}]))"
        if self.latency.in_flight is not None:
            # vLLM may keep its gauges from its last step once every request was
            # aborted (vllm-project/vllm#22545, #29928): an idle pod read as busy. Its
            # meter's own count of the requests it forwarded and that have not ended
            # says whether any is in flight; a replica without that count (no meter,
            # or one from before it) is not judged at all, rather than paged on stale
            # gauges.
            # At sparse traffic no client may wait at a given scrape (they come minutes
            # apart and give up), and an instant's count alone restarted the alert's
            # hold at each: one in flight within the lookback counts too, where no token
            # was made over it (after a mass abort, tokens were, until the lookback
            # holds no request in flight either).
            flight = f"{self.latency.in_flight}{self.sel()}"
            meter = (f"({by} ({flight}) > 0 or ({by} (max_over_time({flight}[{lookback}])) "
                     f"> 0 and on ({REPLICA_LABEL}) {long} == 0))")
            busy = f"({busy} and on ({REPLICA_LABEL}) {meter})"
        counted = f"group by ({REPLICA_LABEL}) ({tokens})"
        # Not stalled: tokens made over the window; or a counter with too few samples
        # there whose rate over the lookback is not 0 (tokens made, or too few again).
        not_flat = f"({counted} unless on ({REPLICA_LABEL}) ({short} or {long} == 0))"
        making = f"({short} > 0 or {not_flat})"
        return f"count({busy} unless on ({REPLICA_LABEL}) {making}) or vector(0)"

    def targets_down(self) -> str:
        """The deployment's scrape targets down (``up`` 0: the last scrape failed), or 1
        where it has none left (``absent``: its pods and their series are gone, or no
        monitor selects them), but for a Deployment kube-state-metrics says is scaled to
        0 (``spec.replicas.min: 0`` is allowed). Read from ``up`` under the deployment's
        own selector: Prometheus writes it for each target with the target's labels,
        which the ServiceMonitor's relabelings and the enforced namespace label set.

        ``up`` carries target labels only: a plain Prometheus job that puts the
        selector's labels on with ``metric_relabel_configs`` (each scraped series, after
        the scrape) leaves them off ``up``, and "none left" fired for good beside a
        healthy deployment. So none is left only where the engine's own gauges are gone
        too. Where ``up`` has the labels that hides nothing: a target removed, or one
        whose scrape fails, has its series marked stale at once, so with no ``up`` left
        no gauge is left either. Such a job still shows every target gone (their
        gauges go stale too), never one down of several (docs/operations.md)."""
        up = f"up{self.sel()}"
        gone = f"absent({up})"
        if self.namespace is not None:
            # A Deployment scaled to 0 has no target to be down: where kube-state-metrics
            # says so, no alert (without it, "none left" fires as for pods gone).
            scaled = render_selector({"namespace": self.namespace,
                                      "deployment": self.deployment})
            gone += f" unless on () (kube_deployment_spec_replicas{scaled} == 0)"
        gone += f" unless on () group({self.busy_gauges()})"
        return f"sum({up} == bool 0) or {gone}"

    def recording_rules(self) -> list[dict[str, Any]]:
        w = self.window
        rules = []
        ttft, tbt = self.latency.ttft, self.latency.tbt
        for short, source in (("ttft", ttft), ("tbt", tbt)):
            for q, tag in ((0.99, "p99"), (0.5, "p50")):
                rules.append(self.record(f"slopilot:{short}_seconds:{tag}",
                                         self.quantile(q, source)))
        # The sustained-breach rows read the P99s over the longer window.
        for figure, source in ((Figure.TTFT_P99_LONG, ttft), (Figure.TBT_P99_LONG, tbt)):
            rules.append(self.record(figure.value, self.quantile(
                0.99, source, duration(self.opt.breach_window_s))))
        rules += [
            self.record(Figure.PREEMPTIONS_PER_MIN.value,
                        f"sum(rate(vllm:num_preemptions_total{self.sel()}[{w}])) * 60"),
            self.record("slopilot:busy_ratio:avg", f"avg(slopilot_busy_ratio{self.sel()})"),
            self.record("slopilot:gpu_utilization:avg", self.gpu_utilization()),
            # The seeds' "GPU utilization": DCGM's where it reports these pods (any
            # backend), else the built-in engine's busy ratio (vLLM exports none).
            self.record(Figure.UTILIZATION.value,
                        f"{self.rec('slopilot:gpu_utilization:avg')} or "
                        f"{self.rec('slopilot:busy_ratio:avg')}"),
            self.record(Figure.REQUESTS_WAITING.value,
                        f"sum(vllm:num_requests_waiting{self.sel()})"),
            self.record(Figure.PREFIX_HIT_RATIO.value,
                        f"sum(rate(vllm:prefix_cache_hits_total{self.sel()}[{w}])) / "
                        f"sum(rate(vllm:prefix_cache_queries_total{self.sel()}[{w}]))"),
            self.record("slopilot:generation_tokens:per_second",
                        f"sum(rate(vllm:generation_tokens_total{self.sel()}[{w}]))"),
            self.record(Figure.STALLED_REPLICAS.value, self.stalled_replicas()),
            self.record(Figure.TARGETS_DOWN.value, self.targets_down()),
        ]
        by = f"priority_class, {REPLICA_LABEL}"
        for p, slo in self.spec.classes().items():
            tokens = (f"sum by ({by}) (rate(vllm:request_generation_tokens_sum"
                      f"{self.sel(priority_class=p.label)}[{w}]))")
            judged, met = (f"sum by ({by}) (rate({SLO_TOKENS}"
                           f"{self.sel(priority_class=p.label, slo=slo.label, **only)}[{w}]))"
                           for only in ({}, {"met": "true"}))
            # Goodput, per replica: its finished tokens times the share of the tokens it
            # judged (ClassSLO.met, under these very objectives) that met them. A share,
            # not the met tokens alone: a replica told this SLO inside the window (an
            # edit, a restart) judged only part of the window's requests.
            exact = f"{tokens} * {met} / ({judged} > 0)"
            # A replica that judges none (an image from before, one not yet told this SLO,
            # a vLLM replica whose meter saw no stream): its finished tokens times its
            # shares of first tokens and of gaps
            # within the SLO, as if every request had the same few slow gaps. That reads
            # high where slow gaps bunch on a few requests (each over its own P99 target).
            approx = tokens
            # On the engine's histograms, even where a meter observes the client's: a
            # replica reads this only where it judged nothing, and a meter that saw a
            # stream judged it, so there its client-side histograms are empty too.
            for metric, limit_ms in ((ttft.engine.metric, slo.ttft_p99_ms),
                                     (tbt.engine.metric, slo.tbt_p99_ms)):
                if limit_ms is not None:  # a replica that observed none keeps its tokens
                    approx += " * (" + self.fraction_within(
                        metric, p.label, limit_ms / 1000, by) + ")"
            expr = f"sum by (priority_class) ({exact} or ({approx}))"
            # The class label keeps promtool's duplicate-rule lint apart.
            rules.append(self.record("slopilot:goodput_tokens:per_second", expr,
                                     priority_class=p.label))
        # The targets themselves, for the dashboard's lines: each deployment's own.
        for target in objectives(self.spec, self.opt):
            cls = {} if target.priority_class is None else \
                {"priority_class": target.priority_class}
            rules.append(self.record(target.series, f"vector({_num(target.value)})", **cls))
        return rules

    def alert(self, row: AlertRule) -> dict[str, Any]:
        on = f" and on ({', '.join(self.ident)}) "
        terms = []
        for cond in row.conditions:
            extra = {"priority_class": row.priority_class} if cond.figure.per_class else {}
            terms.append(f"{self.rec(cond.figure.value, **extra)} {cond.op.value} "
                         f"{_num(cond.threshold)}")
        return {"alert": row.name, "expr": on.join(terms), "for": duration(row.for_s),
                "labels": {"severity": row.severity.value, "action": row.action.value,
                           "priority_class": row.priority_class, **self.ident},
                "annotations": {"summary": f"{self.subject}: {row.summary}",
                                "description": row.description}}

    def alert_context(self) -> AlertContext:
        """The texts' context: the last finite edge of each TTFT histogram read."""
        ttft = self.latency.ttft
        hists = [h for h in (ttft.engine, ttft.client) if h is not None and h.edges]
        return AlertContext(ttft_last_edges=tuple(h.edges[-1] for h in hists),
                            advice=self.advice, up_selector=self.sel())

    def alert_rules(self) -> list[dict[str, Any]]:
        return [self.alert(row) for row in alert_table(self.spec, self.opt,
                                                       self.alert_context())]


def render_rule_groups(spec: SLOSpec, deployment: str, *, namespace: str | None = None,
                       selector: Mapping[str, str] | None = None,
                       options: RuleOptions | None = None,
                       dcgm_namespace: str | None = None,
                       namespace_label: str | None = None,
                       latency: LatencySources = BUILTIN_LATENCY,
                       advice: AlertAdvice = ACTING) -> dict[str, Any]:
    """The plain rules file content: ``{"groups": [...]}``.

    ``namespace``: the deployment's Kubernetes namespace; None only outside a cluster.
    ``namespace_label``: the Prometheus's enforced namespace label (``identity_labels``),
    which every selector, recorded series and alert then carries as well.
    ``latency``: where the backend's TTFT and TBT come from, and on which edges
    (``VLLM_LATENCY``: the meter's client-side histograms, else vLLM's own, whose edges
    an SLO may fall between).
    ``dcgm_namespace``: where the DCGM exporter runs, so that its series scraped without
    honorLabels are read too (``_Renderer.gpu_utilization``); None, they are not.
    ``advice``: who acts on the alerts (``AlertAdvice``: nobody where tuning is off, and
    every row then says so, with action ``inform``).
    """
    opts = options if options is not None else RuleOptions()
    r = _Renderer(spec, deployment, namespace, selector, opts, namespace_label, latency,
                  dcgm_namespace=dcgm_namespace, advice=advice)
    # Kubernetes names hold no '/', so "slopilot/<namespace>/<name>" names one deployment.
    name = f"slopilot-{deployment}" if namespace is None else f"slopilot/{r.subject}"
    group = {"name": name, "interval": duration(opts.interval_s),
             "rules": r.recording_rules() + r.alert_rules()}
    return {"groups": [group]}


def render_rules_yaml(spec: SLOSpec, deployment: str, *, namespace: str | None = None,
                      selector: Mapping[str, str] | None = None,
                      options: RuleOptions | None = None,
                      dcgm_namespace: str | None = None,
                      namespace_label: str | None = None,
                      latency: LatencySources = BUILTIN_LATENCY,
                      advice: AlertAdvice = ACTING) -> str:
    groups = render_rule_groups(spec, deployment, namespace=namespace, selector=selector,
                                dcgm_namespace=dcgm_namespace,
                                options=options, namespace_label=namespace_label,
                                latency=latency, advice=advice)
    return yaml.safe_dump(groups, sort_keys=False, width=100)


def render_prometheus_rule(spec: SLOSpec, deployment: str, namespace: str, *,
                           selector: Mapping[str, str] | None = None,
                           options: RuleOptions | None = None,
                           labels: Mapping[str, str] | None = None,
                           dcgm_namespace: str | None = None,
                           namespace_label: str | None = None,
                           latency: LatencySources = BUILTIN_LATENCY,
                           advice: AlertAdvice = ACTING) -> dict[str, Any]:
    """The same groups as a prometheus-operator PrometheusRule in the deployment's namespace."""
    if not namespace:
        raise RuleError("namespace is empty; pass the deployment's namespace")
    groups = render_rule_groups(spec, deployment, namespace=namespace, selector=selector,
                                dcgm_namespace=dcgm_namespace,
                                options=options, namespace_label=namespace_label,
                                latency=latency, advice=advice)
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


EXAMPLE_DCGM_NAMESPACE = "gpu-operator"
"""The example's DCGM exporter runs there (the GPU operator's default), so the example
reads both shapes of its series (``_Renderer.gpu_utilization``)."""
EXAMPLE_HEADER = (
    "# Generated by `python -m slopilot.tuner.prometheus.rules` from the standard SLO profile\n"
    "# with prefix caching expected (prefix_hit_min 0.95), for deployment \"example\", with\n"
    f"# the DCGM exporter in namespace {EXAMPLE_DCGM_NAMESPACE}.\n"
    "# Do not edit: tests/tuner/test_rules.py checks it equals the rendering.\n")


def render_example() -> str:
    return EXAMPLE_HEADER + render_rules_yaml(example_spec(), EXAMPLE_DEPLOYMENT,
                                              dcgm_namespace=EXAMPLE_DCGM_NAMESPACE)


def example_path() -> Path:
    return Path(__file__).resolve().parents[3] / "manifests" / "prometheus" / "slopilot-rules.yaml"


def main(argv: Sequence[str] | None = None) -> int:
    """Regenerate the example rules manifest, once the arguments parse."""
    argparse.ArgumentParser(
        prog="python -m slopilot.tuner.prometheus.rules",
        description=f"Write the example PrometheusRule manifest {example_path()} "
        "(the seeds' SLO), rendered from the alert table.").parse_args(argv)
    path = example_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_example())
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
