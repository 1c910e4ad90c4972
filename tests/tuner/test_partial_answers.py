"""A Prometheus-API answer that says it may be missing data is not read as complete.

Behind Thanos (and Cortex, Mimir with partial answers on) a query that a store or
querier could not answer whole comes back ``success`` with the series it could read and
a ``warnings`` list saying so. Read as complete, the loop saw no alerts where a store held
them, and built trial windows from part of the replicas' series. The tuner asks for no
partial answers (``partial_response=false``, which Thanos honours and Prometheus does
not read) and takes an answer with a warning as Prometheus unavailable for that read (the
loop holds, as for an outage); PromQL's own annotations (Prometheus 2.46 and later: how
the query read the series it had, not data missing) are no such warning."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest

from slopilot.tuner.prometheus.alerts import AlertSource
from slopilot.tuner.prometheus.query import query_at
from slopilot.tuner.study.evaluator import PrometheusUnavailable

SECRET = "store eu-1: rpc error: tenant team-b's token abc123"


def _answering(answer: dict[str, Any], seen: list[httpx.Request] | None = None
               ) -> httpx.Client:
    def handle(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(request)
        return httpx.Response(200, json=answer)
    return httpx.Client(transport=httpx.MockTransport(handle))


def _vector(**extra: Any) -> dict[str, Any]:
    return {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"priority_class": "p0"}, "value": [1000.0, "0.25"]}]}, **extra}


@pytest.mark.parametrize("warning", [
    "partial response", SECRET, "No StoreAPIs matched for this query",
    "remote_read: failed to read from the store"])
def test_an_answer_with_a_warning_is_prometheus_unavailable(warning: str) -> None:
    query = query_at("http://thanos:9090", client=_answering(_vector(warnings=[warning])))
    with pytest.raises(PrometheusUnavailable, match="may be missing data") as caught:
        query("slopilot:ttft_seconds:p99")
    # The warning's own text is the server's (a tenant's, where it points the URL): the
    # message reaches the CR's status and names how many, not what they say.
    assert SECRET not in str(caught.value)
    assert "partial-response" in str(caught.value)  # the fix: Thanos' flag


def test_the_alerts_read_through_a_warning_are_prometheus_unavailable() -> None:
    answer = {"status": "success", "warnings": ["partial response"],
              "data": {"resultType": "vector", "result": []}}
    src = AlertSource("http://thanos:9090", "chat", namespace="default",
                      client=_answering(answer))
    with pytest.raises(PrometheusUnavailable, match="may be missing data"):
        src.firing()


@pytest.mark.parametrize("info", [
    "PromQL info: metric might not be a counter, name does not end in "
    "_total/_sum/_count/_bucket: \"x\" (1:6)",
    # A PromQL warning annotation too: about the series the query read, not missing ones.
    "PromQL warning: input to histogram_quantile needed to be fixed for monotonicity"])
def test_a_promql_annotation_is_no_missing_data(info: str,
                                                caplog: pytest.LogCaptureFixture) -> None:
    query = query_at("http://prom:9090", client=_answering(
        _vector(warnings=[info], infos=[info])))
    with caplog.at_level(logging.INFO):
        assert query("rate(x[1m])")[0]["value"] == [1000.0, "0.25"]
        query("rate(x[1m])")
    assert sum(info[:40] in r.getMessage() for r in caplog.records) == 1


def test_every_query_asks_for_no_partial_answer() -> None:
    seen: list[httpx.Request] = []
    query_at("http://thanos:9090", client=_answering(_vector(), seen))("up", 1000.0)
    assert seen[0].url.params["partial_response"] == "false"
