"""A request for generation refused at the connection cap, counted in its class as a 429.

``slopilot_connections_refused_total`` counts every refusal at the cap (``--max-connections``,
``connection_cap.py``) and has no class: read alone, a pod whose slots idle keep-alive
clients held answered 503 to every P0 request while p0's arrivals, refusals and TTFT P99
read as an SLO met. So a refused request for generation (``GENERATION_PATHS``) is counted
too, where a request turned away at a full queue is (``serving.submit``,
``serving.refused_for_load``): an arrival of its class (a first try only), a refusal of
it, a miss of its class's objectives, and so a first token never given in the TTFT the
rules judge (``rules.bucket_rates`` reads ``slopilot_requests_refused_total`` in +Inf).
A retry (``serving.RETRY_COUNT_HEADER``) is counted apart, as a 429's.

The body is unread at the cap, so the class is ``PRIORITY_HEADER``'s (given once, a class
``Priority.parse`` reads), else the class a request naming none is served in: its
grant's default class under ``--clients``, else ``serving.UNNAMED_CLASS`` (P1). A class
named in the body alone is counted as that default; each request is one arrival, whatever
its ``n`` or batch. A request the grants would refuse (401, 403) is counted in no class,
as at the door (``client_gate``): it was never offered to the engine.
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.types import Scope

from slopilot.engine.clients import ClientClasses, ClientRefused
from slopilot.engine.connection_cap import CountRefusal
from slopilot.engine.metrics import EngineMetrics
from slopilot.engine.request import Priority
from slopilot.engine.server.client_gate import ClientGrants
from slopilot.engine.server.serving import PRIORITY_HEADER, UNNAMED_CLASS, is_retry

GENERATION_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})
"""The paths that ask ``slopilot serve`` for generation (POST): those a class is judged
on. Not /v1/models, the probes or the scrape."""


def class_at_cap(headers: Headers, clients: ClientClasses | None) -> Priority | None:
    """The class a request refused at the cap is counted in, from its head alone; None
    where the grants would refuse it."""
    values = headers.getlist(PRIORITY_HEADER)
    named: Priority | None = None
    if len(values) == 1:
        try:
            named = Priority.parse(values[0])
        except ValueError:
            named = None  # its body may name one: the default is all the head tells
    if clients is None:
        return UNNAMED_CLASS if named is None else named
    try:
        return clients.serve(headers.get("authorization"), named).priority
    except ClientRefused:
        return None


def cap_refusal_counter(metrics: EngineMetrics, grants: ClientGrants | None) -> CountRefusal:
    """The count ``CapGate`` makes of each request it refuses: a request for generation
    as a 429 of its class, judged by the SLO at its refusal (``metrics.slo``)."""
    def count(scope: Scope) -> None:
        if scope.get("method") != "POST" or scope.get("path") not in GENERATION_PATHS:
            return
        headers = Headers(scope=scope)
        priority = class_at_cap(headers, grants.current() if grants is not None else None)
        if priority is None:
            return
        retry = is_retry(headers)
        if not retry:
            metrics.count_arrived(priority)
        metrics.count_refused(priority, metrics.slo, retry=retry)
    return count
