"""Per-client counters of a server with client grants (``slopilot serve --clients``).

``slopilot_client_requests_total{client, priority_class}``: generation requests the grants
let in, one per HTTP request whatever its ``n``, by the class each was served in (what it
named, or its grant's default); a 429 for load is counted here too (the grants let it in;
the engine turned it away, in ``slopilot_requests_refused_total``).
``slopilot_client_refusals_total{client, reason}``: requests the grants refused, the 401s
(``unknown_key``, always client ``anonymous``) and the 403s (``class_not_allowed``).

The ``client`` label takes a key's name from the grants or ``anonymous``: at most
``clients.MAX_KEYS`` + 1 values, and only those the grants name now (``set_clients``).
Fed and read on the server's event loop only.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric

from slopilot.engine.clients import ANONYMOUS, ClientClasses, Grant, Refusal
from slopilot.engine.metric_names import CLIENT_REFUSALS, CLIENT_REQUESTS
from slopilot.engine.request import Priority


class ClientCounts:
    """A Prometheus collector of the requests each client was served and refused."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self._served: dict[tuple[str, Priority], int] = {}
        self._refused: dict[tuple[str, Refusal], int] = {}

    def set_clients(self, clients: ClientClasses) -> None:
        """The grants from now on: every series they make possible is exported at 0 until
        counted (``rate()`` misses a counter's first value), and those of a client they no
        longer name are dropped. Kept, each edit that renames or rotates keys would leave
        series behind for good, in the Prometheus every tenant shares (as ``Verdicts``
        drops the objectives no longer judged). A client that stays keeps its counts, even
        in a class its grant no longer allows: at most three series a client. A request
        still in flight under the grants before is counted when it ends, and may bring its
        client's series back until the next edit."""
        grants: dict[str, Grant | None] = {k.name: k.grant for k in clients.keys}
        grants[ANONYMOUS] = clients.anonymous
        self._served = {k: v for k, v in self._served.items() if k[0] in grants}
        self._refused = {k: v for k, v in self._refused.items() if k[0] in grants}
        for name, grant in grants.items():
            if grant is None:  # anonymous without a grant: its requests are 401s
                self._refused.setdefault((name, Refusal.UNKNOWN_KEY), 0)
                continue
            for p in Priority:
                if grant.allows(p):
                    self._served.setdefault((name, p), 0)
            if grant.max_class is not Priority.P0:
                self._refused.setdefault((name, Refusal.CLASS_NOT_ALLOWED), 0)

    def count_served(self, client: str, priority: Priority) -> None:
        self._served[client, priority] = self._served.get((client, priority), 0) + 1

    def count_refused(self, client: str, reason: Refusal) -> None:
        self._refused[client, reason] = self._refused.get((client, reason), 0) + 1

    def served(self) -> dict[tuple[str, Priority], int]:
        return dict(self._served)

    def refused(self) -> dict[tuple[str, Refusal], int]:
        return dict(self._refused)

    def collect(self) -> Iterator[Metric]:
        served = CounterMetricFamily(
            CLIENT_REQUESTS, "Generation requests the client grants let in, by client (a "
            "key's name, or anonymous) and the class served.",
            labels=["model_name", "client", "priority_class"])
        for (client, p), count in sorted(self._served.items()):
            served.add_metric([self.model_name, client, p.label], count)
        yield served
        refused = CounterMetricFamily(
            CLIENT_REFUSALS, "Requests the client grants refused: unknown_key (401: no "
            "granted key, no anonymous grant), class_not_allowed (403: a class above the "
            "grant).", labels=["model_name", "client", "reason"])
        for (client, reason), count in sorted(self._refused.items(),
                                              key=lambda kv: (kv[0][0], kv[0][1].value)):
            refused.add_metric([self.model_name, client, reason.value], count)
        yield refused

    def describe(self) -> list[Metric]:
        return list(self.collect())
