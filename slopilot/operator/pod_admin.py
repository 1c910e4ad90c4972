"""``PodAdmin``: the operator's requests to an engine pod's admin API (``/admin/config``,
``/admin/slo``), on the pod's ``admin`` port, with the token the operator minted for
its deployment (tokens.py).

The image is the tenant's, so every answer is bounded: each request has a deadline for
its whole answer (``POD_ANSWER_DEADLINE_S``), a read takes at most ``MAX_CONFIG_BYTES``
and is never inflated, a PUT's answer body is never read, and a refusal is never quoted.
The pods of one deployment are asked side by side (``SYNC_FANOUT``), all within one
deadline (``SYNC_DEADLINE_S``): a slow pod holds its own turn, not every pod after it.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from slopilot.engine.config import ConfigError, EngineConfig
from slopilot.engine.server.admin_credential import ADMIN_TOKEN_SHA256_ENV
from slopilot.operator.pod_layout import ADMIN_PORT_NAME
from slopilot.tuner.prometheus.bounded import (
    Deadline,
    StartTimer,
    bounded_client,
    thread_timer,
)
from slopilot.tuner.prometheus.safe_errors import http_failure, transport_failure

HTTP_TIMEOUT_S = 5.0
POD_ANSWER_DEADLINE_S = 15.0
"""The longest one request to a pod's admin API may take, connect to last byte. The
image is the tenant's: httpx's timeout restarts with every byte, so one that drips its
answer held the sync (a kopf handler thread, and then the CR's lock) for as long as it
liked.
An engine answers in milliseconds, a PUT once the current iteration ends."""
SYNC_FANOUT = 8
"""Pods one sync asks at once (each with its own connection, for its own deadline)."""
SYNC_DEADLINE_S = 30.0
"""The longest one ``sync_config`` may take, every pod together; each request gets at
most what is left of it. A deadline per request alone let a tenant's image that answered
each just inside it hold the sync (a thread of the pod syncs' pool, which its namespace
has few of: pod_sync_pool.py) a minute per replica. Healthy engines answer all 64 replicas'
reads in well under a second."""
MAX_CONFIG_BYTES = 64 * 1024
"""The most of a pod's ``GET /admin/config`` answer read (the admin API's own body cap)."""
CONFIG_PATH, SLO_PATH = "/admin/config", "/admin/slo"


class ApplyError(RuntimeError):
    """A replica did not take a config (unreachable, or an error other than a refusal)."""


def ready(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    if pod.get("metadata", {}).get("deletionTimestamp") or status.get("phase") != "Running":
        return False
    if not status.get("podIP"):
        return False
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or ()}
    return conditions.get("Ready", "True") == "True"


def admin_port(pod: Mapping[str, Any]) -> int | None:
    """The engine container's port named ``admin``, as the operator rendered it."""
    for container in (pod.get("spec") or {}).get("containers") or ():
        if container.get("name") != "engine":
            continue
        for port in container.get("ports") or ():
            if port.get("name") == ADMIN_PORT_NAME and isinstance(port.get("containerPort"),
                                                                   int):
                return int(port["containerPort"])
    return None


def admin_url(pod: Mapping[str, Any]) -> str:
    port = admin_port(pod)
    if port is None:
        raise ApplyError(f"pod {pod['metadata']['name']} has no '{ADMIN_PORT_NAME}' port "
                         "on its engine container")
    ip = str(pod["status"]["podIP"])
    host = f"[{ip}]" if ":" in ip else ip
    return f"http://{host}:{port}"


class PodAdmin:
    """The admin APIs of a deployment's pods, each request bounded (module docstring)."""

    def __init__(self, http: httpx.Client | None = None, *,
                 clock: Callable[[], float] = time.monotonic,
                 timer: StartTimer = thread_timer) -> None:
        self.clock = clock
        """What ``SYNC_DEADLINE_S`` is counted by."""
        self.timer = timer
        """What each request's deadline is timed by: ``POD_ANSWER_DEADLINE_S``, or what
        ``clock`` says is left of the sync's."""
        # No keep-alive: each request opens its own connection, which its deadline can shut.
        self.http = http or bounded_client(HTTP_TIMEOUT_S)

    def get(self, pod: Mapping[str, Any], token: str, path: str = CONFIG_PATH, *,
            ends: float | None = None) -> Any:
        """``path`` of ``pod``'s admin API, parsed (read up to ``MAX_CONFIG_BYTES``: the
        image is the tenant's, so the answer may be anything); by ``ends`` (the clock's
        reading) where given."""
        name = pod["metadata"]["name"]
        url = admin_url(pod) + path
        # Read as sent, never inflated: the cap counts what the operator holds, and a
        # compressed answer (Content-Encoding, asked for or not) inflates a thousandfold.
        headers = {"Authorization": f"Bearer {token}", "Accept-Encoding": "identity"}
        with self.bounded(name, url, ends) as extensions, \
                self.http.stream("GET", url, headers=headers, extensions=extensions) as resp:
            if resp.status_code == 400:  # a read sends no config for it to refuse
                raise ApplyError(f"{name} at {url}: " + http_failure(
                    resp.status_code, resp.headers.get("content-type")))
            if resp.status_code != 200:
                self.refused(name, url, resp.status_code,
                             resp.headers.get("content-type"))
            data = b""
            for chunk in resp.iter_raw():
                data += chunk
                if len(data) > MAX_CONFIG_BYTES:
                    raise ApplyError(f"{name}: {url} answered more than "
                                     f"{MAX_CONFIG_BYTES} bytes; a config is a few "
                                     "hundred")
        try:
            return json.loads(data)
        except (ValueError, RecursionError):  # also nested past the parser's depth
            raise ApplyError(f"{name}: {url} did not answer JSON") from None

    @staticmethod
    def refused(name: str, url: str, status: int, ctype: str | None) -> None:
        """Raise for a non-2xx answer; never quoting its body (safe_errors)."""
        what = http_failure(status, ctype)
        if status == 400:
            raise ConfigError(f"{name} refused the config: {what}")
        if status in (401, 403):
            raise ApplyError(
                f"{name} refused the operator's admin token ({what}): the pod does not run "
                f"this deployment's current {ADMIN_TOKEN_SHA256_ENV} (a rollout under way, "
                "or an image too old to read it: use a current slopilot image)")
        raise ApplyError(f"{name} at {url}: {what}")

    def put(self, pod: Mapping[str, Any], config: EngineConfig, token: str,
            ends: float | None = None) -> None:
        name = pod["metadata"]["name"]
        url = admin_url(pod) + CONFIG_PATH
        status, ctype = self.send(name, url, config.to_dict(), token, ends)
        if status >= 300:
            self.refused(name, url, status, ctype)

    def put_all(self, pods: list[dict[str, Any]], config: EngineConfig, token: str,
                deployment: str) -> None:
        """PUT ``config`` to every pod as a sync asks them: up to ``SYNC_FANOUT`` at once,
        all within ``SYNC_DEADLINE_S``. One after another, a wedged pod held the pods
        after it, and 64 slow ones held the daemon's thread for 16 minutes. ApplyError
        naming each pod that did not take it (after every pod was asked); ConfigError
        where one refused it."""
        ends = self.clock() + SYNC_DEADLINE_S

        def put(pod: Mapping[str, Any]) -> str | None:
            try:
                self.put(pod, config, token, ends)
            except ApplyError as exc:
                return str(exc)
            return None

        with ThreadPoolExecutor(max_workers=max(1, min(SYNC_FANOUT, len(pods))),
                                thread_name_prefix=f"apply-{deployment}") as pool:
            failed = [why for why in pool.map(put, pods) if why is not None]
        if failed:
            raise ApplyError("; ".join(failed))

    def send(self, name: str, url: str, data: Any, token: str,
             ends: float | None = None) -> tuple[int, str | None]:
        """PUT ``data`` to ``url``: the answer's status and content type. Its body is never
        read: the image is the tenant's, and an endless body read whole (httpx's
        ``put``) would fill the operator's memory."""
        with self.bounded(name, url, ends) as extensions, \
                self.http.stream("PUT", url, json=data, extensions=extensions,
                                 headers={"Authorization": f"Bearer {token}"}) as resp:
            return resp.status_code, resp.headers.get("content-type")

    @contextlib.contextmanager
    def bounded(self, name: str, url: str, ends: float | None = None
                ) -> Iterator[dict[str, Any]]:
        """The ``extensions`` of one request to ``name``'s admin API, whose whole answer
        then has ``POD_ANSWER_DEADLINE_S``, or what is left until ``ends`` if less (a
        sync's deadline); its transport errors as ApplyError."""
        deadline_s = POD_ANSWER_DEADLINE_S
        bound = f"{deadline_s:g} s deadline per request (POD_ANSWER_DEADLINE_S)"
        if ends is not None and (left_s := ends - self.clock()) < deadline_s:
            if left_s <= 0:
                raise ApplyError(f"{name} at {url}: not asked: this sync's "
                                 f"{SYNC_DEADLINE_S:g} s (SYNC_DEADLINE_S) are over")
            # Named by the sync's whole deadline: what was left varies, and the
            # PodsConfigured message, which quotes this, is written only when it changes.
            deadline_s = left_s
            bound = f"{SYNC_DEADLINE_S:g} s of this sync (SYNC_DEADLINE_S)"
        deadline = Deadline(deadline_s, self.timer)
        late = (f"{name} at {url}: did not finish its answer within the {bound}; "
                "an engine answers in milliseconds: is this image the engine?")
        try:
            yield {"trace": deadline.trace}
        except httpx.HTTPError as exc:
            if deadline.passed:  # the deadline shut the socket under the read
                raise ApplyError(late) from None
            raise ApplyError(f"{name} at {url}: {transport_failure(exc)}") from None
        finally:
            deadline.cancel()
        if deadline.passed:  # a shut socket ends a body without a length as if complete
            raise ApplyError(late)
