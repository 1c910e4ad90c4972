"""An API server that does not answer: said in one line, and waited for where it may yet.

A kubeconfig missing or broken is permanent (``kubeapi.KubeConfigError``: the command
stops, naming the file). An API server that does not answer may be starting, or behind a
network blip: client-go's informers and kopf's watches retry it, and so does the
operator's start, with back-off and one line a try. So may one that answers 5xx (a
load balancer's 503 page before it, an API server still starting): ``NotReady``.
``operator uninstall``, which a person runs and watches, stops at it instead, naming the
server.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import urllib3

from slopilot.operator.kubeapi import ApiError, Kube

T = TypeVar("T")

FIRST_RETRY_S = 1.0
MAX_RETRY_S = 30.0
"""The longest wait between two tries: an API server back is noticed within it."""

Unreachable = urllib3.exceptions.HTTPError
"""What the client raises when no HTTP answer came (refused, timed out, TLS failed)."""


class NotReady(Exception):
    """An answer that says the server is not ready yet (5xx): waited for as no answer."""

    def __init__(self, error: ApiError) -> None:
        super().__init__(f"is not ready ({error.status} {error.reason}".rstrip()
                         + f": {error.message})")
        self.error = error


def not_ready(error: ApiError) -> bool:
    """Whether a refusal is the server's not being ready (5xx) rather than its word."""
    return error.status >= 500


def transient(exc: BaseException) -> bool:
    """Whether an API call's error may pass by itself, so that the same call is worth
    trying again later: no answer (refused, reset, timed out: urllib3's errors, or the
    socket's where one gets through), a server not ready (5xx), or one asking for fewer
    calls (429). A refusal (403, 404, 409, 422) is the server's word: the same call gets
    it again."""
    if isinstance(exc, ApiError):
        return not_ready(exc) or exc.status == 429
    return isinstance(exc, (Unreachable, ConnectionError, TimeoutError))


def server_of(kube: Kube) -> str:
    return str(kube.client.configuration.host)


def why_unreachable(exc: urllib3.exceptions.HTTPError) -> str:
    """The cause, in one line: "Failed to establish a new connection: [Errno 111]
    Connection refused", not urllib3's pool, URL and retry count around it."""
    reason: BaseException = exc
    if isinstance(exc, urllib3.exceptions.MaxRetryError) and exc.reason is not None:
        reason = exc.reason
    text = " ".join(str(reason).split()) or type(reason).__name__
    # urllib3 puts the connection's repr first, which names the server a second time.
    head, sep, tail = text.partition("): ")
    return tail if sep and head.startswith(("HTTPConnection(", "HTTPSConnection(")) else text


def unreachable_message(server: str, exc: urllib3.exceptions.HTTPError) -> str:
    return f"cannot reach the API server at {server} ({why_unreachable(exc)})"


def until_reachable(step: Callable[[], T], *, server: str, wait: Callable[[float], bool],
                    warn: Callable[[str], None]) -> T | None:
    """``step()``'s result once the API server answers it; None where ``wait(seconds)``
    says a stop was asked for meanwhile (returns True). Each try that got no answer is
    one line to ``warn``, without a traceback."""
    delay = FIRST_RETRY_S
    while True:
        try:
            with _quiet_pool_retries():
                return step()
        except Unreachable as exc:
            warn(f"{unreachable_message(server, exc)}; retrying in {delay:g} s (is the "
                 "cluster up, and the kubeconfig's server right?)")
        except NotReady as exc:
            warn(f"the API server at {server} {exc}; retrying in {delay:g} s")
        if wait(delay):
            return None
        delay = min(delay * 2, MAX_RETRY_S)


@contextmanager
def _quiet_pool_retries() -> Iterator[None]:
    """urllib3 logs each of its own retries of a connection (three a try, "Retrying
    (Retry(total=2...") above the one line a try says: kept to errors while it waits."""
    pool = logging.getLogger("urllib3.connectionpool")
    level = pool.level
    pool.setLevel(max(level, logging.ERROR))
    try:
        yield
    finally:
        pool.setLevel(level)
