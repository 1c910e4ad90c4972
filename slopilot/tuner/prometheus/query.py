"""One Prometheus query client for the tuner: PromQL in, the API's result list out.

Every reader of Prometheus (the window adapter, workload profiling) goes through
``query_at`` so that an unreachable or refusing Prometheus always surfaces as
``PrometheusUnavailable`` with the same message, and quickly (one short retry); and
``AlertSource`` queries through it too, so every answer is read within ``bounded``'s
byte cap and deadline. An ``https`` server's certificate is verified unless the caller's
``TLSVerify`` says otherwise (``tls``): the loop acts on these numbers.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from slopilot.engine.request import Priority
from slopilot.engine.window_summary import ClassFigures, Window, WindowSummary, or_none
from slopilot.tuner.prometheus.bounded import (
    ANSWER_DEADLINE_S,
    MAX_ANSWER_BYTES,
    Charge,
    bounded_client,
    read_answer,
)
from slopilot.tuner.prometheus.safe_errors import http_failure
from slopilot.tuner.prometheus.tls import VERIFIED, TLSVerify
from slopilot.tuner.study.evaluator import PrometheusUnavailable, WindowRejected

if TYPE_CHECKING:
    import httpx

log = logging.getLogger(__name__)

# (expr, evaluation time in Unix seconds or None for now) -> the result's sample list.
QueryAt = Callable[[str, float | None], list[dict[str, Any]]]


def query_at(url: str, timeout_s: float = 5.0, *, verify: TLSVerify = VERIFIED,
             client: httpx.Client | None = None, deadline_s: float = ANSWER_DEADLINE_S,
             max_bytes: int = MAX_ANSWER_BYTES, charge: Charge | None = None) -> QueryAt:
    """A ``QueryAt`` over ``GET /api/v1/query`` of the server at ``url``.

    Errors never quote the answer (``safe_errors``): the URL may be a tenant's, and the
    message reaches the CR's status. Redirects are not followed, so an allowed host
    cannot bounce the request elsewhere. Each answer is read within ``max_bytes`` and
    ``deadline_s`` (``bounded``), its bytes counted by ``charge`` as they come (the
    namespace's ``answer_budget``: a spent one refuses the read). ``verify``: how an
    https server's certificate is checked (CAFileError here when its CA bundle cannot be
    read). ``client``: the caller's, which checks certificates its own way (the caller
    closes it).
    """
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ValueError(f"prometheus url={url!r}: expected an http(s) URL, "
                         "e.g. http://prometheus-operated.monitoring:9090")
    base = url.rstrip("/")
    # One quick retry of a failed connect: a dead Prometheus should say so in seconds.
    http = client or bounded_client(timeout_s, verify=verify, retries=1)

    noted: set[str] = set()

    def run(expr: str, at: float | None = None) -> list[dict[str, Any]]:
        params = {"query": expr, "partial_response": "false"}
        if at is not None:
            params["time"] = f"{at:.3f}"
        answer = read_answer(http, base, "/api/v1/query", params, deadline_s=deadline_s,
                             max_bytes=max_bytes, charge=charge)
        if answer.status != 200:
            raise PrometheusUnavailable(f"Prometheus at {base} refused the query {expr!r}: "
                                        f"{http_failure(answer.status, answer.content_type)}")
        body = _json(answer.body)
        result = _vector(body)
        if result is not None:
            _refuse_partial(body, base, expr, noted)
        if result is None:
            raise PrometheusUnavailable(
                f"Prometheus at {base} answered the query {expr!r} with "
                f"{http_failure(200, answer.content_type, 'not a Prometheus result')}")
        return result

    return run


# A PromQL annotation ("PromQL info: ..." or "PromQL warning: ...", Prometheus 2.46 and
# later; infos in a list of their own in newer releases) is about how the query read the series it
# had (a bucket set fixed for monotonicity, a name that may not be a counter), not data
# missing: held on it, the loop could wait forever on a rule that reads fine.
_ANNOTATION = "PromQL "
_NOTED_MAX = 64
PARTIAL_FIX = ("ask for no partial answers (Thanos: --query.partial-response=false on "
               "the querier; the tuner's queries ask with partial_response=false)")


def _refuse_partial(answer: dict[str, Any], base: str, expr: str, noted: set[str]) -> None:
    """PrometheusUnavailable for a success answer whose warnings say it may lack data.

    Thanos, Cortex and Mimir answer a query some store could not serve whole with what
    they could read and a warning; read as whole, no alert fired where a store held it
    and a trial's window summed part of its replicas. The warnings' text is the server's
    (a tenant's, where it points the URL), so the message counts them and quotes none:
    it reaches the CR's status. PromQL's own annotations are logged once each."""
    warnings = answer.get("warnings")
    texts = [w for w in warnings if isinstance(w, str)] if isinstance(warnings, list) else []
    missing = [w for w in texts if not w.startswith(_ANNOTATION)]
    if not missing and warnings not in (None, []) and len(texts) != len(warnings):
        missing = [""]  # a warning that is no string still says something went wrong
    for info in texts:
        if info.startswith(_ANNOTATION) and info not in noted and len(noted) < _NOTED_MAX:
            noted.add(info)
            log.info("Prometheus at %s on %r: %s", base, expr, info[:300])
    if missing:
        many = "a warning" if len(missing) == 1 else f"{len(missing)} warnings"
        raise PrometheusUnavailable(
            f"Prometheus at {base} answered the query {expr!r} with {many} that it may be "
            f"missing data (a partial answer), read as no answer: {PARTIAL_FIX}")


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, RecursionError):  # RecursionError: nested past the parser's depth
        return None


def _vector(answer: Any) -> list[dict[str, Any]] | None:
    """The result list of a success answer, each sample checked; None for anything else.

    Checked here so that no reader downstream fails on a value with an error that quotes
    it (``float('...')``): every value and every ``le`` bound is a number. A range
    vector's answer (a matrix: each series' raw samples under ``values``, what the probe
    reads an arrivals counter's bins from) is checked sample by sample the same way.
    """
    if not isinstance(answer, dict) or answer.get("status") != "success":
        return None
    data = answer.get("data")
    result = data.get("result") if isinstance(data, dict) else None
    if not isinstance(result, list):
        return None
    for sample in result:
        if not isinstance(sample, dict) or not isinstance(sample.get("metric"), dict):
            return None
        labels = sample["metric"]
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
            return None
        points = sample.get("values") if "values" in sample else [sample.get("value")]
        if not isinstance(points, list) or not all(
                isinstance(p, list) and len(p) == 2 and _time(p[0]) and _number(p[1])
                for p in points):
            return None
        if "le" in labels and not _number(labels["le"]):
            return None
    return result


def _number(text: Any) -> bool:
    try:
        float(text)
    except (TypeError, ValueError):
        return False
    return isinstance(text, str)


def _time(t: Any) -> bool:
    """A sample's timestamp: Prometheus writes it as a JSON number (seconds)."""
    return isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t)


CHECK_METRICS = "check what the deployment's pods export on /metrics"
"""The fix a figure no engine exports names (a window's, a workload profile's)."""


def _unexportable(**figures: Mapping[str, float]) -> None:
    """WindowRejected for a figure that is infinite or negative. The series are each pod's
    /metrics as its image wrote them; rates of counters and quantiles of histograms never
    give these, so a broken or hostile exporter did: such a window measures nothing, and
    taken as a controller error it failed the trial and rolled back at every tick."""
    for figure, by_class in figures.items():
        for cls, value in by_class.items():
            if math.isinf(value) or value < 0:
                where = f"{cls} " if cls else ""
                raise WindowRejected(
                    f"{where}{figure} read {value:g}, which no engine's series give: "
                    f"{CHECK_METRICS}")


def window_summary(*, requests: Mapping[str, float], throughput: Mapping[str, float],
                   ttft_p99_s: Mapping[str, float], tbt_p99_s: Mapping[str, float],
                   goodput: Mapping[str, float], preemptions_per_min: float,
                   overall_ttft_p99_s: float, overall_tbt_p99_s: float, duration_s: float,
                   window: Window, request_rate: float | None = None,
                   busy_ratio: float | None = None, busy_ratio_max: float | None = None,
                   gpu_utilization: float | None = None,
                   requests_waiting: float | None = None,
                   prefix_cache_hit_ratio: float | None = None,
                   refused: Mapping[str, float] | None = None,
                   stalled_replicas: float | None = None,
                   targets_down: float | None = None,
                   ttft_samples: Mapping[str, float] | None = None,
                   awaiting: Mapping[str, float] | None = None) -> WindowSummary:
    """Per-class figures read from histograms and counters (by ``priority_class``) as a
    ``WindowSummary``: the one builder of both live sources, Prometheus and the direct
    scrape. P99s are in seconds, NaN (or absent) where a class had no samples; ``refused``:
    the requests each class turned away for load (none where absent); ``ttft_samples``:
    the observations each class's TTFT P99 ranks (``ClassFigures.ttft_samples``; None,
    or a class absent, where not read); ``awaiting``: the requests each class had given
    no first token yet at the window's end (``ClassFigures.requests_awaiting``; None
    where not read, a class absent where no replica exports it: None for it too).

    A class with no goodput series has no SLO (best effort): all its tokens count, as in
    the simulator. A NaN preemption rate or request rate (no series yet) reads as none.
    An infinite or negative figure rejects the window (``_unexportable``).
    """
    refused = refused or {}
    _unexportable(requests=requests, refused=refused, throughput=throughput, goodput=goodput,
                  ttft_p99=ttft_p99_s, tbt_p99=tbt_p99_s, ttft_samples=ttft_samples or {},
                  awaiting=awaiting or {},
                  preemptions={"": preemptions_per_min},
                  overall_ttft_p99={"": overall_ttft_p99_s},
                  overall_tbt_p99={"": overall_tbt_p99_s})
    def number(value: float) -> float:
        return 0.0 if math.isnan(value) else value

    def ms(seconds: float) -> float | None:
        return or_none(seconds * 1000.0)

    classes: dict[Priority, ClassFigures] = {}
    for p in Priority:
        c = p.label
        finished = number(requests.get(c, 0.0))
        good = goodput.get(c, math.nan)
        if c not in goodput and finished > 0:
            good = throughput.get(c, 0.0)
        classes[p] = ClassFigures(
            requests_finished=finished, throughput_tok_s=number(throughput.get(c, 0.0)),
            # No finished request of the class: no goodput either (NaN from 0/0).
            goodput_tok_s=number(good),
            ttft_p99_ms=ms(ttft_p99_s.get(c, math.nan)),
            tbt_p99_ms=ms(tbt_p99_s.get(c, math.nan)),
            requests_refused=number(refused.get(c, 0.0)),
            ttft_samples=None if ttft_samples is None else or_none(
                ttft_samples.get(c, math.nan)),
            requests_awaiting=None if awaiting is None else or_none(
                awaiting.get(c, math.nan)))
    counted = [x.ttft_samples for x in classes.values()]
    waiting = [x.requests_awaiting for x in classes.values() if x.requests_awaiting is not None]
    overall = ClassFigures(
        requests_finished=sum(x.requests_finished for x in classes.values()),
        requests_refused=sum(x.requests_refused for x in classes.values()),
        throughput_tok_s=sum(x.throughput_tok_s for x in classes.values()),
        goodput_tok_s=sum(x.goodput_tok_s for x in classes.values()),
        ttft_p99_ms=ms(overall_ttft_p99_s), tbt_p99_ms=ms(overall_tbt_p99_s),
        ttft_samples=None if None in counted else sum(x or 0.0 for x in counted),
        requests_awaiting=sum(waiting) if waiting else None)
    return WindowSummary(
        duration_s=float(duration_s),
        preemptions_per_min=number(preemptions_per_min), overall=overall, classes=classes,
        request_rate=or_none(request_rate), busy_ratio=or_none(busy_ratio),
        busy_ratio_max=or_none(busy_ratio_max), gpu_utilization=or_none(gpu_utilization),
        requests_waiting=or_none(requests_waiting),
        prefix_cache_hit_ratio=or_none(prefix_cache_hit_ratio),
        stalled_replicas=or_none(stalled_replicas), targets_down=or_none(targets_down),
        window=dataclasses.replace(window, bucketed=True))
