"""One watch of a collection, read as raw events, that a stop ends at once.

A watch blocks in a socket read until its next event or its ``timeoutSeconds``: a thread
reading one outlived the operator's stop by as long. So each watch open is registered
with its thread's ``OpenWatches``, and ``close_all`` (the operator stopping) shuts their
connections down from the stopping thread: the blocked read ends there and then
(urllib3's ``HTTPResponse.shutdown``, made for this), and no new watch opens after it.
The events are read raw (the API server's JSON), as kopf reads them, with no model.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import urllib3
from kubernetes.watch.watch import iter_resp_lines

from slopilot.operator.kubeapi import REQUEST_TIMEOUT_S, Kube, api_error


class OpenWatches:
    """The watches open now, each closed by ``close_all``; closed, none opens again."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: set[urllib3.BaseHTTPResponse] = set()
        self.closed = False

    def add(self, response: urllib3.BaseHTTPResponse) -> bool:
        """Registered; False (and shut) where ``close_all`` came first."""
        with self._lock:
            if not self.closed:
                self._open.add(response)
                return True
        response.shutdown()
        return False

    def discard(self, response: urllib3.BaseHTTPResponse) -> None:
        with self._lock:
            self._open.discard(response)

    def close_all(self) -> None:
        with self._lock:
            self.closed = True
            open_now, self._open = list(self._open), set()
        for response in open_now:
            response.shutdown()


def watch_events(kube: Kube, path: str, *, version: str, timeout_s: int,
                 watches: OpenWatches) -> Iterator[dict[str, Any]]:
    """The events (``type``, raw ``object``) of a watch of ``path`` from ``version``, until
    the API server ends it (``timeout_s``) or ``watches.close_all``. ApiError where the
    watch is refused or sends an ERROR event (410: ``version`` expired)."""
    query = {"watch": "true", "resourceVersion": version, "timeoutSeconds": str(timeout_s)}
    method, url, headers, _body, _ = kube.client.param_serialize(
        "GET", path, query_params=list(query.items()),
        header_params={"Accept": "application/json"}, auth_settings=["BearerToken"])
    answer = kube.client.call_api(method, url, headers,
                                  _request_timeout=timeout_s + REQUEST_TIMEOUT_S)
    response = answer.response
    if answer.status >= 400:
        raw = answer.read()
        try:
            payload = json.loads(raw)
        except ValueError:
            payload = None
        raise api_error(answer.status, payload, raw)
    if not watches.add(response):
        return
    try:
        for line in iter_resp_lines(response):
            event = json.loads(line)
            if event.get("type") == "ERROR":
                status = event.get("object") or {}
                raise api_error(int(status.get("code") or 500), status, line.encode())
            yield event
    except (urllib3.exceptions.HTTPError, OSError):
        if not watches.closed:  # a connection lost on its own: the caller lists again
            raise
    finally:
        watches.discard(response)
        response.release_conn()
