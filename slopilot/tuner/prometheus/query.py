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
from slopilot.tuner.study.evaluator import PrometheusUnavailable

# (expr, evaluation time in Unix seconds or None for now) -> the result's sample list.
QueryAt = Callable[[str, float | None], list[dict[str, Any]]]


def query_at(url: str, timeout_s: float = 5.0) -> QueryAt:
    """A ``QueryAt`` over prometheus-api-client for the server at ``url``."""
    from prometheus_api_client import PrometheusApiClientException, PrometheusConnect
    from requests import RequestException
    from urllib3.util.retry import Retry

    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ValueError(f"prometheus url={url!r}: expected an http(s) URL, "
                         "e.g. http://prometheus-operated.monitoring:9090")
    base = url.rstrip("/")
    # One quick retry: a dead Prometheus should say so in seconds, not minutes.
    client = PrometheusConnect(base, disable_ssl=True, timeout=max(1, int(timeout_s)),
                               retry=Retry(total=1, backoff_factor=0.1))

    def run(expr: str, at: float | None = None) -> list[dict[str, Any]]:
        params = None if at is None else {"time": f"{at:.3f}"}
        try:
            result: list[dict[str, Any]] = client.custom_query(expr, params=params)
        except RequestException as exc:
            raise PrometheusUnavailable(
                f"cannot reach Prometheus at {base}: {type(exc).__name__}: {exc}; "
                "check the URL and that Prometheus is running") from None
        except PrometheusApiClientException as exc:
            raise PrometheusUnavailable(
                f"Prometheus at {base} refused the query {expr!r}: {exc}") from None
        return result

    return run


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
