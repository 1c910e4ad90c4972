"""An instant query of a range vector answers a matrix: each series' raw samples under
``values``. The probe reads the arrivals counter's raw samples that way
(``profiling.raw_arrivals``); the reader refused every matrix as "not a Prometheus
result", and the burstiness was never measured outside tests that faked the query."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from slopilot.tuner.prometheus.query import query_at
from slopilot.tuner.study.evaluator import PrometheusUnavailable


def _answering(data: dict[str, Any]) -> httpx.Client:
    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"status": "success", "data": data})
    return httpx.Client(transport=httpx.MockTransport(handle))


def _matrix(values: Any) -> dict[str, Any]:
    return {"resultType": "matrix", "result": [
        {"metric": {"instance": "10.0.0.1:8000", "priority_class": "p1"}, "values": values}]}


def test_a_range_vectors_raw_samples_are_read() -> None:
    query = query_at("http://prom:9090", client=_answering(
        _matrix([[1000.0, "3"], [1015.0, "9"], [1030.0, "12"]])))
    (series,) = query("slopilot_requests_arrived_total[10m]")
    assert series["values"] == [[1000.0, "3"], [1015.0, "9"], [1030.0, "12"]]


@pytest.mark.parametrize("values", [
    [[1000.0, "x"]], "3", [[1000.0]], [["t", "3"]], None, [[1000.0, "3", "4"]]])
def test_a_matrix_whose_samples_are_not_numbers_is_refused(values: Any) -> None:
    query = query_at("http://prom:9090", client=_answering(_matrix(values)))
    with pytest.raises(PrometheusUnavailable, match="not a Prometheus result"):
        query("slopilot_requests_arrived_total[10m]")
