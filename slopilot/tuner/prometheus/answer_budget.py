"""How many bytes of Prometheus answers one namespace's deployments may read a minute.

Each CR names its own Prometheus (``spec.prometheus.url``), and with
``SLOPILOT_ALLOWED_PROMETHEUS`` unset or broad a tenant may point it at a server of its
own. Every byte of an answer is parsed with ``json.loads``, which holds the GIL to its end:
one tenant's server answering each query with a valid vector at the cap, four steps at
once (``tuning_pool.STEPS_PER_NAMESPACE``), took the operator's threads for seconds at a
time and stalled every other namespace's steps, pod syncs and kopf's loop. The per-query
caps (``bounded.answer_cap``) bound one answer; this bounds how often: a token bucket per
namespace of ``NAMESPACE_BYTES_PER_MIN``, filled at that rate and holding at most as much,
that every answer's bytes are taken from as they are read (the declared length first),
before any is parsed. Once spent, a query is refused as ``PrometheusUnavailable`` (the
loop holds as for an outage) with the CR and the fix in the message, until the bucket
refills; other namespaces' buckets are their own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from slopilot.tuner.prometheus.bounded import Charge
from slopilot.tuner.study.evaluator import PrometheusUnavailable

_MIB = 1024 * 1024

NAMESPACE_BYTES_PER_MIN = 16 * _MIB
"""A namespace's answers a minute. A deployment's real answers come to well under 1 MiB a
minute: the alerts query every 5 s tick (12 a minute, tens of bytes with nothing firing,
at most ~80 KiB with every rule firing: ``bounded.ALERTS_ANSWER_BYTES``) and, once a
window (2 minutes by default), some 30 aggregated queries of a few KiB and the raw reads
(2 MiB at most, at 64 replicas: ``bounded.answer_cap``). 16 MiB covers a dozen of the
largest deployments reading everything at once, hundreds of typical ones; as ``json.loads``
time (0.3 s a 8 MiB answer, measured), about 0.6 s of one core a minute, 1 % of it."""


class AnswerBudget:
    """One namespace's bucket: ``bytes_per_min`` a minute, at most that much held.

    ``clock``: monotonic seconds (a test's fake one). Thread-safe: its deployments' steps
    read on the tuning pool's threads at once."""

    def __init__(self, namespace: str, bytes_per_min: int = NAMESPACE_BYTES_PER_MIN,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if bytes_per_min < 1:
            raise ValueError(f"bytes_per_min={bytes_per_min!r}: expected at least 1")
        self.namespace, self.bytes_per_min = namespace, bytes_per_min
        self._clock = clock
        self._lock = threading.Lock()
        self._left = float(bytes_per_min)
        self._at = clock()

    def left(self) -> float:
        """The bytes that may be read now."""
        with self._lock:
            return self._refilled()

    def take(self, size: int, deployment: str) -> None:
        """Take ``size`` bytes for ``deployment``'s read, or refuse it
        (``PrometheusUnavailable``) and take none where fewer are left."""
        with self._lock:
            left = self._refilled()
            if size > left:
                raise PrometheusUnavailable(self._spent(deployment))
            self._left = left - size

    def _refilled(self) -> float:
        now = self._clock()
        # A clock that stepped back refills nothing (and restarts the count from now).
        gained = max(now - self._at, 0.0) * self.bytes_per_min / 60.0
        self._at = now
        self._left = min(float(self.bytes_per_min), self._left + gained)
        return self._left

    def _spent(self, deployment: str) -> str:
        return (f"LLMDeployment {self.namespace}/{deployment}: the Prometheus answers read "
                f"for namespace {self.namespace}'s deployments passed its budget of "
                f"{self.bytes_per_min / _MIB:g} MiB a minute "
                "(the operator's $SLOPILOT_PROMETHEUS_MIB_PER_MIN), so this query was not read; "
                "its reads resume as the budget refills. Real answers to the tuner's "
                "queries are KiB: check that spec.prometheus.url is a Prometheus that "
                "answers only what was asked (not a proxy adding series); a namespace "
                "of many large deployments needs the administrator to raise "
                "$SLOPILOT_PROMETHEUS_MIB_PER_MIN")


class NamespaceBudgets:
    """Every namespace's ``AnswerBudget``, made as first asked for."""

    def __init__(self, bytes_per_min: int = NAMESPACE_BYTES_PER_MIN,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.bytes_per_min, self._clock = bytes_per_min, clock
        self._lock = threading.Lock()
        self._budgets: dict[str, AnswerBudget] = {}

    def budget(self, namespace: str, bytes_per_min: int | None = None) -> AnswerBudget:
        """``namespace``'s budget; with ``bytes_per_min``, made with that rate (the
        operator's setting, read once at start: a budget made with another is made
        again, whole)."""
        rate = self.bytes_per_min if bytes_per_min is None else bytes_per_min
        with self._lock:
            found = self._budgets.get(namespace)
            if found is None or (bytes_per_min is not None and found.bytes_per_min != rate):
                found = self._budgets[namespace] = AnswerBudget(namespace, rate, self._clock)
            return found

    def charge(self, namespace: str, deployment: str,
               bytes_per_min: int | None = None) -> Charge:
        """What ``deployment``'s reads pass as ``charge`` (``bounded.read_answer``)."""
        budget = self.budget(namespace, bytes_per_min)
        return lambda size: budget.take(size, deployment)


BUDGETS = NamespaceBudgets()
"""The operator's: one process, one bucket per namespace, whichever controller reads."""
