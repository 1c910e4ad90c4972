"""One Prometheus query client for the tuner: PromQL in, the API's result list out.

Every reader of Prometheus (the live evaluator, the window adapter, workload profiling)
goes through ``query_at`` so that an unreachable or refusing Prometheus always surfaces
as ``PrometheusUnavailable`` with the same message, and quickly (one short retry).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from slopilot.engine.request import Priority
from slopilot.tuner.prometheus.safe_errors import http_failure, transport_failure
from slopilot.tuner.study.evaluator import PrometheusUnavailable

# (expr, evaluation time in Unix seconds or None for now) -> the result's sample list.
QueryAt = Callable[[str, float | None], list[dict[str, Any]]]


def query_at(url: str, timeout_s: float = 5.0) -> QueryAt:
    """A ``QueryAt`` over ``GET /api/v1/query`` of the server at ``url``.

    Errors never quote the answer (``safe_errors``): the URL may be a tenant's, and the
    message reaches the CR's status. Redirects are not followed, so an allowed host
    cannot bounce the request elsewhere.
    """
    import httpx

    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ValueError(f"prometheus url={url!r}: expected an http(s) URL, "
                         "e.g. http://prometheus-operated.monitoring:9090")
    base = url.rstrip("/")
    # One quick retry of a failed connect: a dead Prometheus should say so in seconds.
    client = httpx.Client(timeout=max(1.0, float(timeout_s)), follow_redirects=False,
                          transport=httpx.HTTPTransport(retries=1, verify=False))

    def run(expr: str, at: float | None = None) -> list[dict[str, Any]]:
        params = {"query": expr} if at is None else {"query": expr, "time": f"{at:.3f}"}
        try:
            resp = client.get(f"{base}/api/v1/query", params=params)
        except httpx.HTTPError as exc:
            raise PrometheusUnavailable(
                f"cannot reach Prometheus at {base}: {transport_failure(exc)}; "
                "check the URL and that Prometheus is running") from None
        ctype = resp.headers.get("content-type")
        if resp.status_code != 200:
            raise PrometheusUnavailable(f"Prometheus at {base} refused the query {expr!r}: "
                                        f"{http_failure(resp.status_code, ctype)}")
        try:
            answer = resp.json()
        except ValueError:
            answer = None
        result = _vector(answer)
        if result is None:
            raise PrometheusUnavailable(
                f"Prometheus at {base} answered the query {expr!r} with "
                f"{http_failure(resp.status_code, ctype, 'not a Prometheus result')}")
        return result

    return run


def _vector(answer: Any) -> list[dict[str, Any]] | None:
    """The result list of a success answer, each sample checked; None for anything else.

    Checked here so that no reader downstream fails on a value with an error that quotes
    it (``float('...')``): every value and every ``le`` bound is a number.
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
        labels, value = sample["metric"], sample.get("value")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
            return None
        if not (isinstance(value, list) and len(value) == 2 and _number(value[1])):
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


def window_summary(*, requests: Mapping[str, float], throughput: Mapping[str, float],
                   ttft_p99_s: Mapping[str, float], tbt_p99_s: Mapping[str, float],
                   goodput: Mapping[str, float], preemptions_per_min: float,
                   duration_s: float) -> dict[str, Any]:
    """Per-class series read from Prometheus (by ``priority_class``) as a DESIGN §8
    summary, the shape ``objective.score`` and the simulator share.

    A class with no goodput series has no SLO (best effort): all its tokens count, as in
    the simulator. A NaN preemption rate (no series yet) reads as none.
    """
    preempt = 0.0 if math.isnan(preemptions_per_min) else preemptions_per_min
    classes: dict[str, dict[str, Any]] = {}
    for p in Priority:
        c = p.label
        good = goodput.get(c, math.nan)
        if c not in goodput and requests.get(c, 0.0) > 0:
            good = throughput.get(c, 0.0)
        classes[c] = {
            "requests_finished": requests.get(c, 0.0),
            "ttft_p99_ms": ttft_p99_s.get(c, math.nan) * 1000.0,
            "tbt_p99_ms": tbt_p99_s.get(c, math.nan) * 1000.0,
            "throughput_tok_s": throughput.get(c, 0.0),
            # No finished request of the class: no goodput either (NaN from 0/0).
            "goodput_tok_s": 0.0 if math.isnan(good) else good,
            "preemptions_per_min": preempt,
        }

    def worst(key: str) -> float:
        return max((x[key] for x in classes.values() if math.isfinite(x[key])),
                   default=math.nan)

    return {
        "duration_s": float(duration_s),
        "requests_finished": sum(x["requests_finished"] for x in classes.values()),
        "throughput_tok_s": sum(x["throughput_tok_s"] for x in classes.values()),
        "goodput_tok_s": sum(x["goodput_tok_s"] for x in classes.values()),
        "ttft_p99_ms": worst("ttft_p99_ms"), "tbt_p99_ms": worst("tbt_p99_ms"),
        "preemptions_per_min": preempt, "classes": classes,
    }
