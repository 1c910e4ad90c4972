"""The scrape limits on an LLMDeployment's ServiceMonitor, sized from what one replica
exports.

The ServiceMonitor selects the deployment's Service, whose endpoints are every pod of the
CR's namespace that carries the deployment's labels: a pod the tenant makes by hand (any
image; the operator's allow-list is not asked) is scraped too. Without limits such a pod
could put any number of series into the Prometheus every tenant's rules, alerts and
trials read. With them, a scrape over a limit fails whole (the target reads ``up`` 0)
and nothing of it is stored.

The figures (``tests/operator/test_scrape_limits.py`` renders the expositions and fails
where one outgrows its figure):

- the built-in engine: 1,936 samples, 195 kB, after traffic in all three classes with
  the knobs exported (10-character model name); 12 more with an SLO judged. Fixed by
  its families, not by load: ``BUILTIN_SERIES``. With ``spec.clients``, at most three
  more per key and three for anonymous (``client_counts.ClientCounts``).
- a vLLM pod's ``http`` port is the meter's: vLLM's /metrics, then the meter's own, 291
  samples measured (``METER_SERIES``). vLLM's own is estimated, not measured (no vLLM
  here), from v0.11.0's families (``VLLM_SERIES``): 13 histograms of at most 22 bounds
  (+Inf, _sum, _count, _created: ~300 samples), ~15 counters with their _created and
  ~10 gauges (~40), prometheus_client's process and Python collectors (~20), and the
  HTTP instrumentation (prometheus-fastapi-instrumentator: per route a counter by
  status group, a 4-bound duration histogram and two size summaries, ~20 samples a
  route; its ~45 routes plus "none" for unmatched paths, ~950, and one 30-bound
  histogram over all): about 1,350, taken as 1,400.

Each figure times ``MARGIN``: a limit too low fails every scrape of a healthy
deployment, where one too high only lets a rogue pod store a few thousand series more.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from slopilot.operator.spec import Backend, LLMDeploymentSpec
from slopilot.operator.validation import MAX_MODEL_REF

MARGIN = 4
"""Each measured figure times this: room for series added before the figures are, and
for what differs between vLLM releases."""
BUILTIN_SERIES = 2048
"""A built-in engine replica's samples without client grants (1,948 measured)."""
PER_CLIENT_SERIES = 3
"""Samples one client of ``spec.clients`` adds (ClientCounts: its classes, its refusals)."""
METER_SERIES = 320
"""The meter's own samples on a vLLM pod (291 measured)."""
VLLM_SERIES = 1400
"""vLLM's own samples, estimated from its families (module docstring)."""
BYTES_PER_SAMPLE = 256
"""Bytes of exposition per sample beside the model name each line carries (the built-in
engine's: 90, HELP and TYPE lines included), with room for vLLM's longer label sets."""
LABEL_LIMIT = 64
"""Labels on one sample, the scrape's own added (job, namespace, service, pod,
container, endpoint, instance, the identity labels, __name__): the built-in engine's
most is 15 (``slopilot_config_info``, one per knob), vLLM's ``cache_config_info`` about
25."""
LABEL_NAME_LENGTH_LIMIT = 128
"""The longest label name: 24 on the built-in engine, under 40 on vLLM."""
LABEL_VALUE_LENGTH_LIMIT = 2 * MAX_MODEL_REF
"""The longest label value: ``model_name``, at most ``MAX_MODEL_REF``; twice that for a
model path beside it in an info series."""
TARGETS_PER_REPLICA = 2
"""``targetLimit`` per ``spec.replicas.max``: a rollout starts a pod beside the others
(maxSurge 1) and a lowered max applies before the pods above it have gone. Only ready
endpoints are targets (``service_monitor.not_ready_relabelings``)."""

LIMIT_FIELDS = ("sampleLimit", "targetLimit", "labelLimit", "labelNameLengthLimit",
                "labelValueLengthLimit", "bodySizeLimit")
"""The ServiceMonitor's spec fields these fill (prometheus-operator: sampleLimit since
v0.24, targetLimit v0.43, the label limits v0.50, bodySizeLimit v0.73)."""


@dataclasses.dataclass(frozen=True)
class ScrapeLimits:
    """One ServiceMonitor's limits, per scrape of one target but ``target_limit``."""

    sample_limit: int
    target_limit: int
    label_limit: int
    label_name_length_limit: int
    label_value_length_limit: int
    body_size_limit_bytes: int

    def to_service_monitor(self) -> dict[str, Any]:
        """The ServiceMonitor ``spec`` fields (``LIMIT_FIELDS``), the body size in whole
        KiB as prometheus-operator's ByteSize writes powers of 2."""
        return {"sampleLimit": self.sample_limit, "targetLimit": self.target_limit,
                "labelLimit": self.label_limit,
                "labelNameLengthLimit": self.label_name_length_limit,
                "labelValueLengthLimit": self.label_value_length_limit,
                "bodySizeLimit": f"{math.ceil(self.body_size_limit_bytes / 1024)}KiB"}


def replica_series(spec: LLMDeploymentSpec) -> int:
    """The samples one replica of ``spec`` exports at most, by the figures above."""
    if spec.backend is Backend.VLLM:
        return VLLM_SERIES + METER_SERIES
    clients = 0 if spec.clients is None else len(spec.clients.keys) + 1  # + anonymous
    return BUILTIN_SERIES + PER_CLIENT_SERIES * clients


def scrape_limits(spec: LLMDeploymentSpec) -> ScrapeLimits:
    samples = MARGIN * replica_series(spec)
    return ScrapeLimits(
        sample_limit=samples,
        target_limit=TARGETS_PER_REPLICA * spec.max_replicas,
        label_limit=LABEL_LIMIT, label_name_length_limit=LABEL_NAME_LENGTH_LIMIT,
        label_value_length_limit=LABEL_VALUE_LENGTH_LIMIT,
        body_size_limit_bytes=samples * (BYTES_PER_SAMPLE + len(spec.model_name)))
