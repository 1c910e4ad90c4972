"""A thin JSON client for the Kubernetes API: plain dicts in and out, for any resource.

The official client's typed models would make every comparison with the rendered dicts
(plain JSON) a conversion; its ``ApiClient`` still does the work that matters here
(kubeconfig or in-cluster login, TLS, bearer tokens), and this class only builds paths
and reads JSON. It is synchronous: kopf runs sync handlers and daemons in threads.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import kubernetes.client
import kubernetes.config
import yaml

MERGE_PATCH = "application/merge-patch+json"
USER_AGENT = "slopilot-operator"  # audit logs (and the RBAC test) tell our calls apart
REQUEST_TIMEOUT_S = 30.0
# The tuning daemons' steps (tuning_pool.STEP_THREADS threads), the pod syncs
# (pod_sync_pool.SYNC_THREADS) and kopf's handlers (settings.HANDLER_THREADS) call the API
# at once; urllib3 would otherwise open and discard a connection per call above its
# default 10.
CONNECTION_POOL = 64
LIST_PAGE = 500
"""Objects asked for per page of a list (``limit``), as kubectl and client-go ask: a
namespace's thousands of pods unpaged were one response, parsed and held whole."""
MAX_LIST_PAGES = 200
"""Pages one list reads at most (100,000 objects at ``LIST_PAGE``). The API server ends a
list by handing no ``continue`` token; one that never stops (a bug, a hostile proxy in
front of it) would otherwise have the list read for ever, empty pages included."""
MAX_LIST_ITEMS = 100_000
"""Objects one list reads at most, for an API server whose pages are larger than the
``limit`` asked."""
SELECT_PAGE = 50
"""Objects asked for per page of a ``select``: a tenant-writable kind, whose objects may
be as large as etcd takes (about 1.5 MiB each), so a page holds 75 MiB at the worst, not
``LIST_PAGE``'s 750; a namespace's honest objects of one CR (its pods, its ReplicaSets)
are a page."""


@dataclasses.dataclass(frozen=True)
class Selected:
    """What a ``Kube.select`` kept, and how many more it would have kept past its bound."""

    items: list[dict[str, Any]]
    unkept: int


class ApiError(Exception):
    """A refused request: ``status`` (HTTP), ``reason`` (Kubernetes' CamelCase), message,
    and the Status's ``details`` (``kind``, ``name``, ``causes``: ``{}`` where none)."""

    def __init__(self, status: int, reason: str, message: str, *,
                 details: Mapping[str, Any] | None = None) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status, self.reason, self.message = status, reason, message
        self.details: Mapping[str, Any] = details or {}


def api_error(status: int, payload: Any, raw: bytes) -> ApiError:
    """The ApiError of an answer ``status`` >= 400, from its Status object where it is one
    (``raw``, its text, where not)."""
    if not isinstance(payload, dict):
        return ApiError(status, "", str(raw[:200]))
    details = payload.get("details")
    return ApiError(status, str(payload.get("reason", "")),
                    str(payload.get("message", raw[:200])),
                    details=details if isinstance(details, dict) else None)


class ListError(RuntimeError):
    """A list not read whole: its continue token expired on the list restarted for it
    too, or the API server kept handing out pages past ``MAX_LIST_PAGES`` or
    ``MAX_LIST_ITEMS``."""


class KubeConfigError(Exception):
    """No login to be had: the kubeconfig is missing or broken, or the pod's service
    account is not mounted. Permanent (unlike an API server that does not answer): the
    message names the file and the fix."""


def kubeconfig_source() -> str:
    """Where the login is read from, as a user would name it."""
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return "the pod's service account (KUBERNETES_SERVICE_HOST is set)"
    path = os.environ.get("KUBECONFIG")
    return f"KUBECONFIG={path}" if path else "~/.kube/config (KUBECONFIG is unset)"


def load_client() -> kubernetes.client.ApiClient:
    """In a pod, the service account; elsewhere the kubeconfig (``KUBECONFIG`` or ~/.kube).
    KubeConfigError where neither gives a login."""
    config = kubernetes.client.Configuration()
    try:
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            kubernetes.config.load_incluster_config(client_configuration=config)
        else:
            kubernetes.config.load_kube_config(config_file=os.environ.get("KUBECONFIG"),
                                               client_configuration=config)
    except yaml.YAMLError as exc:
        raise KubeConfigError(f"{kubeconfig_source()}: not valid YAML ({_one_line(exc)}); "
                              "fix the file, or point KUBECONFIG at a cluster's kubeconfig"
                              ) from None
    # The loader's own refusals, and what a file of the wrong shape (a list, a number)
    # or no file (a folder, unreadable) raises on the way.
    except (kubernetes.config.ConfigException, OSError, TypeError, ValueError, KeyError,
            AttributeError) as exc:
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            raise KubeConfigError(
                f"{kubeconfig_source()}: no login ({_one_line(exc)}); mount the pod's "
                "service-account token (automountServiceAccountToken)") from None
        fix = ("point KUBECONFIG at a cluster's kubeconfig (the file kubectl uses), or run "
               "in a pod with a service account")
        paths = os.environ.get("KUBECONFIG") or "~/.kube/config"
        if not any(os.path.exists(os.path.expanduser(p)) for p in paths.split(os.pathsep)):
            raise KubeConfigError(f"{kubeconfig_source()}: no such file; {fix}") from None
        raise KubeConfigError(f"{kubeconfig_source()}: not a kubeconfig to log in with "
                              f"({_one_line(exc)}); {fix}") from None
    config.connection_pool_maxsize = CONNECTION_POOL
    client = kubernetes.client.ApiClient(configuration=config)
    client.user_agent = USER_AGENT
    return client


def _one_line(exc: BaseException) -> str:
    # yaml's errors span lines (the mark, the context): the refusal is one.
    return " ".join(str(exc).split()) or type(exc).__name__


def path_segment_problem(what: str, value: str) -> str | None:
    """Why ``value`` cannot be one segment of a resource path (the API server's own rule
    for names), or None. Names reach paths from objects tenants write (an owner
    reference's name is not validated), and the HTTP client resolves ``..`` before
    sending: ``../../team-b/...`` would be a request about another namespace."""
    if value in (".", "..") or "/" in value or "%" in value:
        return (f"{what}={value[:80]!r} is no object name (it may not be '.' or '..' or "
                "hold '/' or '%')")
    return None


def resource_path(api_version: str, plural: str, namespace: str | None = None,
                  name: str | None = None, subresource: str | None = None) -> str:
    """``/api/v1/namespaces/ns/pods/x`` or ``/apis/apps/v1/...`` for any resource.
    ValueError for a namespace, name or subresource that is not one path segment."""
    for what, value in (("namespace", namespace), ("name", name),
                        ("subresource", subresource)):
        if value and (problem := path_segment_problem(what, value)) is not None:
            raise ValueError(problem)
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    path = base + (f"/namespaces/{namespace}" if namespace else "") + f"/{plural}"
    if name:
        path += f"/{name}"
    if subresource:
        path += f"/{subresource}"
    return path


class Kube:
    """``Kube(api_client)``: get, list, create, patch, delete and discovery, returning
    dicts."""

    def __init__(self, client: kubernetes.client.ApiClient) -> None:
        self.client = client

    def request(self, method: str, path: str, *, body: Any = None,
                query: Mapping[str, str] | None = None,
                content_type: str = "application/json") -> Any:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        m, url, headers, data, _ = self.client.param_serialize(
            method, path, query_params=list((query or {}).items()), header_params=headers,
            body=body, auth_settings=["BearerToken"])
        response = self.client.call_api(m, url, headers, data,
                                        _request_timeout=REQUEST_TIMEOUT_S)
        raw = response.read()
        try:
            payload = json.loads(raw) if raw else {}
        except ValueError:
            # Not the API server's JSON: a proxy or load balancer in front of it (an HTML
            # 503 while it starts). Said as its status, not a JSONDecodeError traceback.
            text = raw[:200].decode("utf-8", "replace")
            raise ApiError(response.status, "NotJSON" if response.status < 400 else "",
                           f"an answer that is not JSON: {text!r}") from None
        if response.status >= 400:
            raise api_error(response.status, payload, raw)
        return payload

    def get(self, api_version: str, plural: str, namespace: str | None,
            name: str) -> dict[str, Any] | None:
        """The object, or None where it does not exist."""
        try:
            obj = self.request("GET", resource_path(api_version, plural, namespace, name))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return dict(obj)

    def _pages(self, api_version: str, plural: str, namespace: str | None,
               label_selector: str | None, what: str, page: int
               ) -> Iterator[list[dict[str, Any]]]:
        """One list, a page of ``page`` objects per request, yielded as it comes; ApiError
        as a page is refused (410 included)."""
        path = resource_path(api_version, plural, namespace)
        query = {"labelSelector": label_selector} if label_selector else {}
        query["limit"] = str(page)
        read = 0
        for _ in range(MAX_LIST_PAGES):
            answer = self.request("GET", path, query=query)
            items: list[dict[str, Any]] = answer.get("items") or []
            read += len(items)
            if read > MAX_LIST_ITEMS:
                raise ListError(f"{what}: more than {MAX_LIST_ITEMS} objects "
                                "(MAX_LIST_ITEMS); not read further")
            token = (answer.get("metadata") or {}).get("continue")
            del answer  # the page is the caller's now: it drops what it does not keep
            yield items
            del items  # not held while the next page is read
            if not token:
                return
            query["continue"] = str(token)
        raise ListError(f"{what}: the API server still had more after {MAX_LIST_PAGES} "
                        f"pages (MAX_LIST_PAGES) of {page}; not read further")

    def _select_once(self, api_version: str, plural: str, namespace: str | None,
                     label_selector: str | None, what: str, page: int,
                     keep: Callable[[dict[str, Any]], bool] | None, most: int) -> Selected:
        kept: list[dict[str, Any]] = []
        unkept = 0
        for items in self._pages(api_version, plural, namespace, label_selector, what,
                                 page):
            for obj in items:
                if keep is not None and not keep(obj):
                    continue
                if len(kept) < most:
                    kept.append(obj)
                else:
                    unkept += 1
            del items  # before the next page is read: one page alive, not the list
        return Selected(kept, unkept)

    def _select(self, api_version: str, plural: str, namespace: str | None,
                label_selector: str | None, page: int,
                keep: Callable[[dict[str, Any]], bool] | None, most: int) -> Selected:
        what = f"{plural} in namespace {namespace}" if namespace else plural
        if label_selector:
            what += f" (labelSelector {label_selector})"
        try:
            return self._select_once(api_version, plural, namespace, label_selector, what,
                                     page, keep, most)
        except ApiError as exc:
            if exc.status != 410:
                raise
        try:
            return self._select_once(api_version, plural, namespace, label_selector, what,
                                     page, keep, most)
        except ApiError as exc:
            if exc.status != 410:
                raise
            raise ListError(f"{what}: the list's continue token expired (410 Gone) again "
                            f"on the list restarted for it: {exc.message}") from None

    def list(self, api_version: str, plural: str, namespace: str | None, *,
             label_selector: str | None = None) -> list[dict[str, Any]]:
        """Every object of the resource (matching ``label_selector``), read ``LIST_PAGE``
        at a time. A continue token that expires (410 Gone: etcd compacted the version
        the list began at) restarts the list once; ListError where the restarted one
        expires too, or the pages do not end (``MAX_LIST_PAGES``, ``MAX_LIST_ITEMS``).

        Every object is kept: for lists of what only the operator writes (the ledger's
        shards, in its own namespace) or of LLMDeployments. A tenant-writable kind
        selected by labels a tenant can copy is read with ``select``."""
        return self._select(api_version, plural, namespace, label_selector, LIST_PAGE,
                            None, MAX_LIST_ITEMS).items

    def select(self, api_version: str, plural: str, namespace: str | None, *,
               keep: Callable[[dict[str, Any]], bool], most: int,
               label_selector: str | None = None, page: int = SELECT_PAGE) -> Selected:
        """The objects ``keep`` accepts, at most ``most``, judged as each page of ``page``
        arrives: what a page carries and ``keep`` refuses is dropped before the next is
        read, so a namespace of a tenant's big objects with copied labels costs one page
        of memory, not the list. Past ``most``, the rest is counted (``unkept``), not kept.
        Paged, restarted and bounded as ``list`` is."""
        return self._select(api_version, plural, namespace, label_selector, page, keep,
                            most)

    def create(self, api_version: str, plural: str, namespace: str | None,
               body: Mapping[str, Any]) -> dict[str, Any]:
        return dict(self.request("POST", resource_path(api_version, plural, namespace),
                                 body=dict(body)))

    def patch(self, api_version: str, plural: str, namespace: str | None, name: str,
              patch: Mapping[str, Any], *, subresource: str | None = None) -> dict[str, Any]:
        """A JSON merge patch (RFC 7386): maps merge, lists are replaced whole."""
        path = resource_path(api_version, plural, namespace, name, subresource)
        return dict(self.request("PATCH", path, body=dict(patch), content_type=MERGE_PATCH))

    def delete(self, api_version: str, plural: str, namespace: str | None, name: str, *,
               resource_version: str | None = None) -> None:
        """Delete the object; with ``resource_version``, only the object still at it
        (a precondition: ApiError 409 where it changed, 404 where it is gone)."""
        options: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if resource_version is not None:
            options["preconditions"] = {"resourceVersion": resource_version}
        self.request("DELETE", resource_path(api_version, plural, namespace, name),
                     body=options)

    def serves(self, api_version: str, plural: str) -> bool:
        """Whether the cluster serves the resource (e.g. the prometheus-operator CRDs)."""
        try:
            found = self.request("GET", "/api/v1" if api_version == "v1"
                                 else f"/apis/{api_version}")
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return any(r.get("name") == plural for r in found.get("resources", []))
