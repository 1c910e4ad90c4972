"""One Prometheus query client for the tuner: PromQL in, the API's result list out.

Every reader of Prometheus (the live evaluator, the window adapter, workload profiling)
goes through ``query_at`` so that an unreachable or refusing Prometheus always surfaces
as ``PrometheusUnavailable`` with the same message, and quickly (one short retry).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from slopilot.tuner.evaluator_base import PrometheusUnavailable

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
