"""A Kubernetes API emulator that kopf and the official client can run against.

kmock 0.8's KubernetesEmulator stores objects and streams watches, but as released it
leaves out what real clients rely on (listed below). This subclass keeps kmock's
object store (``emulator.objects``) and its reaction DSL (user reactions still win)
and replaces the state changes with apiserver rules:

- server-filled metadata: uid, a global increasing resourceVersion, generation bumped on
  spec changes, creationTimestamp, the namespace from the URL, generateName;
- 201 on create, 409 ``AlreadyExists``/``Conflict``, 404 ``NotFound``, 422 ``Invalid``;
- PUT (replace) and PATCH (merge, strategic-merge as merge, JSON patch with ``test``);
- the status subresource changes only status, the main resource never status (for
  resources that declare the subresource), so controllers and users do not clobber each other;
- lists with ``kind``/``apiVersion``/``resourceVersion``, label and field selectors, and
  in pages where ``limit`` asks (``continue`` tokens, in namespace and name order);
- watches from a resourceVersion (an event log, like etcd's), namespaced, with timeoutSeconds;
- a DELETE's ``preconditions`` (uid, resourceVersion: 409 where not met);
- finalizers and deletionTimestamp; background garbage collection through ownerReferences;
- CRDs created through the API become discoverable resources; their schema prunes
  unknown fields, defaults and validates custom objects, CEL rules and list-map keys
  included;
- names, labels, replica counts, resource quantities and a ConfigMap's 1 MiB of data
  are checked as the apiserver checks them (kube_validation.py), so an object a cluster
  would refuse is refused here (bodies are read up to its 3 MiB), and resource
  quantities are stored in its canonical form ("1" for 1, "500m" for 0.5);
- RBAC for callers restricted by token (``restrict``, kube_authz.py): a call no rule
  allows is 403 ``Forbidden``, and a ``SelfSubjectAccessReview`` is answered from the
  same rules (every other token is unrestricted, as the tests' admin client); each
  decision about a restricted caller is kept in ``decisions`` (``refused``: the 403s);
  ``enforce_owner_references`` adds the admission plugin
  OwnerReferencesPermissionEnforcement's checks for restricted callers;
- ``fail(...)``: the next matching writes fail with a given status before they apply
  (a lost connection, an overloaded apiserver), for tests of what a client does then;
- what kubectl needs (kube_openapi.py): OpenAPI v2 and v3 discovery, server-side tables
  with a CRD's printer columns, and ``fieldValidation=Strict``;
- ``GET /version`` and ``/version/``.
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import copy
import dataclasses
import json
import random
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp.web
import attrs
from kmock import KubernetesEmulator, Request, ResourceInfo, Response, method, resource

from tests.support import kube_objects as ko
from tests.support import kube_openapi as oa
from tests.support.crd_schema import (
    apply_defaults,
    cel_errors,
    list_map_errors,
    prune,
    schema_errors,
    served_schema,
)
from tests.support.kmock_fixes import Fault, route
from tests.support.kube_authz import (
    Attributes,
    Rule,
    allows,
    attributes,
    forbidden,
    is_access_review,
    owner_reference_checks,
    review,
)
from tests.support.kube_validation import object_problems, store_quantities

CRDS = resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")
ALL_VERBS = {"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"}
Key = tuple[resource, str | None, str]


@attrs.define(kw_only=True)
class KubeEmulator(KubernetesEmulator):
    """``KubeEmulator(seed=0)``; enter it and serve it with ``kmock.Server(emulator)``."""

    seed: int = 0
    kube_version: tuple[int, int] = (1, 33)
    _rv: int = attrs.field(default=0, init=False)
    _log: list[tuple[resource, dict[str, Any]]] = attrs.field(factory=list, init=False)
    _log_rvs: list[int] = attrs.field(factory=list, init=False)
    _changed: asyncio.Condition = attrs.field(factory=asyncio.Condition, init=False)
    _rng: random.Random = attrs.field(init=False)
    _schemas: dict[resource, dict[str, Any]] = attrs.field(factory=dict, init=False)
    _outcomes: dict[Request, tuple[int, dict[str, Any]]] = attrs.field(factory=dict, init=False)
    _closing: bool = attrs.field(default=False, init=False)
    _faults: list[Fault] = attrs.field(factory=list, init=False)
    _columns: dict[resource, list[dict[str, Any]]] = attrs.field(factory=dict, init=False)
    # Every watch opened: (plural, its labelSelector or None), for tests of what a client
    # asks the API server to stream.
    watches: list[tuple[str, str | None]] = attrs.field(factory=list, init=False)
    # Every list answered: (plural, its labelSelector, the limit asked, the objects the
    # answer carried), for tests of how much of a list a client asks for at once.
    lists: list[tuple[str, str | None, str | None, int]] = attrs.field(factory=list,
                                                                       init=False)
    # Callers limited by RBAC (kube_authz.py): bearer token -> (user name, rules).
    _restricted: dict[str, tuple[str, list[Rule]]] = attrs.field(factory=dict, init=False)
    # Every authorization of a restricted caller's call, admission checks included:
    # (user, what it asked, whether allowed).
    decisions: list[tuple[str, Attributes, bool]] = attrs.field(factory=list, init=False)
    # The OwnerReferencesPermissionEnforcement admission plugin, for restricted callers.
    enforce_owner_references: bool = attrs.field(default=False, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._rng = random.Random(self.seed)
        self.resources.load_bundled()  # the builtin resources of a recent cluster (K3s)
        above = self.fallback ** 1  # above kmock's own fallbacks, below any test reaction
        # The official client asks for /version/, /apis/ and /api/ with a trailing slash.
        above["get /version/"] << self._serve_server_version
        above["get /apis/"] << self._serve_apis
        above["get /api/"] << self._serve_api
        above[method.PUT] << self._serve_update  # kmock maps PUT to no action
        above[method.DELETE] << self._serve_update  # nor a DELETE of a whole collection
        above[method.GET] << self._serve_openapi

    # --- requests ------------------------------------------------------------------------

    def restrict(self, token: str, user: str, rules: list[Rule]) -> None:
        """Calls bearing ``token`` are ``user``'s, allowed only what ``rules`` grant."""
        self._restricted[token] = (user, list(rules))

    def _caller(self, request: Request) -> tuple[str, list[Rule]] | None:
        token = (request.headers.get("Authorization") or "").removeprefix("Bearer ")
        return self._restricted.get(token)

    def _authorize(self, request: Request) -> aiohttp.web.StreamResponse | None:
        """An access review's answer, or None; raises 403 for a call not granted."""
        caller = self._caller(request)
        if is_access_review(request):
            return aiohttp.web.json_response(
                review(None if caller is None else caller[1], request.data), status=201)
        call = attributes(request)
        if caller is not None and call is not None and not self._decide(caller, call):
            raise forbidden(caller[0], call)
        return None

    def _decide(self, caller: tuple[str, list[Rule]], call: Attributes) -> bool:
        allowed = allows(caller[1], call)
        self.decisions.append((caller[0], call, allowed))
        return allowed

    @property
    def refused(self) -> list[tuple[str, Attributes]]:
        """Every call refused a restricted caller: (user, what it asked)."""
        return [(user, call) for user, call, allowed in self.decisions if not allowed]

    def _admit_owner_references(self, request: Request, old: dict[str, Any] | None,
                                new: Any) -> None:
        """OwnerReferencesPermissionEnforcement (``enforce_owner_references``): 403 for a
        restricted caller's write of ownerReferences it may not set."""
        caller = self._caller(request)
        call = attributes(request)
        # A status write changes nothing but status (the API server drops the rest).
        if not self.enforce_owner_references or caller is None or call is None \
                or request.subresource or not isinstance(new, dict):
            return
        if call.name is None:  # a create: the object's name is in its body
            call = dataclasses.replace(call, name=(new.get("metadata") or {}).get("name"))
        for check in owner_reference_checks(call, old, new, self._resource_of):
            if not self._decide(caller, check):
                what = ("cannot set blockOwnerDeletion if an ownerReference refers to a "
                        "resource you can't set finalizers on" if check.verb == "update"
                        else "cannot set an ownerRef on a resource you can't delete")
                raise ko.api_error(403, "Forbidden", f"{call.resource} \"{call.name}\" is "
                                   f"forbidden: {what}: {forbidden(caller[0], check).message}")

    def _resource_of(self, api_version: str, kind: str) -> tuple[str, str] | None:
        group = api_version.rpartition("/")[0]
        for res in self.resources:
            if res.group == group and self.resources[res].kind == kind:
                return group, str(res.plural)
        return None

    async def _handle(self, request: Request) -> aiohttp.web.StreamResponse:
        if (answer := self._authorize(request)) is not None:
            return answer
        try:
            if request.resource is not None and request.resource.plural:
                async with self._changed:
                    outcome = self._mutate(request)
                    if outcome is not None:
                        self._outcomes[request] = outcome
                        self._changed.notify_all()
            # Skip KubernetesEmulator._handle: its state changes are what this class replaces.
            return await self._route(request)
        finally:
            self._outcomes.pop(request, None)

    def fail(self, method: str, plural: str, *, subresource: str | None = None,
             status: int = 500, times: int = 1) -> None:
        """Make the next ``times`` such writes fail with ``status``, changing nothing."""
        self._faults.append(Fault(method.upper(), plural, subresource, status, times))

    def heal(self) -> None:
        """Every write ``fail`` still has to fail goes through (a webhook fixed)."""
        for fault in self._faults:
            fault.times = 0

    def _inject_fault(self, request: Request) -> None:
        for fault in self._faults:
            if fault.times > 0 and request.method.value == fault.method \
                    and request.resource is not None and request.resource.plural == fault.plural \
                    and request.subresource == fault.subresource:
                fault.times -= 1
                raise ko.api_error(fault.status, "InternalError",
                                   "an injected failure: the write was not applied")

    async def _route(self, request: Request) -> aiohttp.web.StreamResponse:
        return await route(self, request)

    def _mutate(self, request: Request) -> tuple[int, dict[str, Any]] | None:
        res = self._known(request)
        if request.method != method.GET:
            self._inject_fault(request)
        strict = request.params.get("fieldValidation") == "Strict"
        if request.method == method.POST and request.name is None:
            if strict and isinstance(request.data, dict):
                self._strict(res, request.data)
            self._admit_owner_references(request, None, request.data)
            return 201, self._create_object(res, request.namespace, request.data)
        if request.name is None:
            if request.method == method.DELETE:
                return 200, self._delete_collection(res, request)
            return None
        key = (res, request.namespace if self._namespaced(res) else None, request.name)
        sub = request.subresource
        if sub not in (None, "status") and request.method != method.GET:
            raise ko.api_error(405, "MethodNotAllowed", f"subresource {sub!r} is not served")
        if request.method == method.PATCH:
            ctype = request.headers.get("Content-Type", "application/merge-patch+json")
            current = self._get(key)
            new = ko.apply_patch(current, request.data, ctype, res, request.name)
            # As the API server: a uid in a patch is a precondition ("Precondition
            # failed: UID in precondition"), so a patch meant for a deleted object never
            # lands on one re-created under its name (the kubelet's status patches).
            sent_uid = (new.get("metadata") or {}).get("uid")
            if sent_uid is not None and sent_uid != current["metadata"].get("uid"):
                raise ko.conflict(res, request.name)
            if strict:
                self._strict(res, new)
            self._admit_owner_references(request, current, new)
            return 200, self._update(key, current, new, to_status=sub == "status")
        if request.method == method.PUT:
            if not isinstance(request.data, dict):
                raise ko.api_error(400, "BadRequest", "the body must be a JSON object")
            current = self._get(key)
            self._admit_owner_references(request, current, request.data)
            return 200, self._update(key, current, copy.deepcopy(request.data),
                                     to_status=sub == "status")
        if request.method == method.DELETE:
            options = request.data if isinstance(request.data, dict) else {}
            self._check_preconditions(key, options.get("preconditions") or {})
            policy = options.get("propagationPolicy") or request.params.get("propagationPolicy")
            return 200, self._delete_object(key, orphan=policy == "Orphan")
        return None

    def _check_preconditions(self, key: Key, preconditions: Mapping[str, Any]) -> None:
        """A DELETE's ``preconditions``: the uid first, then the resourceVersion, as the
        API server checks them; 409 where the object no longer meets one."""
        meta = self._get(key)["metadata"]
        for field, what in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
            wanted = preconditions.get(field)
            if wanted is not None and wanted != meta.get(field):
                raise ko.precondition_failed(key[0], key[1], key[2], what, wanted,
                                             meta.get(field))

    # --- state changes (call under self._changed) ---------------------------------------

    def _create_object(self, res: resource, namespace: str | None, data: Any) -> dict[str, Any]:
        if not isinstance(data, dict):
            raise ko.api_error(400, "BadRequest", "the body must be a JSON object")
        body = copy.deepcopy(data)
        meta = body.setdefault("metadata", {})
        if self._namespaced(res):
            if namespace and meta.get("namespace", namespace) != namespace:
                raise ko.api_error(400, "BadRequest", "the namespace of the provided object "
                                   "does not match the namespace sent on the request")
            meta["namespace"] = namespace or meta.get("namespace")
            if not meta["namespace"]:
                raise ko.api_error(400, "BadRequest", "a namespaced object needs a namespace")
        else:
            meta.pop("namespace", None)
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise ko.invalid(res, None, "metadata.name: Required value: name or "
                                 "generateName is required")
            meta["name"] = meta["generateName"] + "".join(
                self._rng.choices("bcdfghjklmnpqrstvwxz2456789", k=5))
        key = (res, meta.get("namespace"), meta["name"])
        if key in self._objects and not self._objects[key].deleted:
            raise ko.already_exists(res, meta["name"], self._kind(res))
        body["apiVersion"] = ko.api_version_of(res)
        body["kind"] = self._kind(res)
        meta["uid"] = str(uuid.UUID(int=self._rng.getrandbits(128), version=4))
        meta["generation"] = 1
        meta["creationTimestamp"] = ko.now_rfc3339()
        for server_only in ("deletionTimestamp", "resourceVersion"):
            meta.pop(server_only, None)
        if "status" in self._info(res).subresources:
            body.pop("status", None)  # status is written through /status only
        body = self._admit(res, body)
        if res == CRDS:
            body["status"] = self._register_crd(body)
        self._commit(key, "ADDED", body)
        return body

    def _update(self, key: Key, old: dict[str, Any], new: dict[str, Any], *,
                to_status: bool) -> dict[str, Any]:
        res, _, name = key
        sent_rv = new.get("metadata", {}).get("resourceVersion")
        if sent_rv and sent_rv != old["metadata"]["resourceVersion"]:
            raise ko.conflict(res, name)
        new = ko.carry_server_fields(old, new, status_subresource="status" in self._info(
            res).subresources, to_status=to_status)
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        if not to_status:
            ko.bump_generation(old, new)
        new = self._admit(res, new)  # a status write is pruned and validated too
        if new == old:
            return old  # a no-op write changes nothing and emits no event, as in etcd
        if res == CRDS:
            new["status"] = self._register_crd(new)
        meta = new["metadata"]
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            self._commit(key, "MODIFIED", new)
            return self._remove(key)
        self._commit(key, "MODIFIED", new)
        return new

    def _delete_object(self, key: Key, *, orphan: bool = False) -> dict[str, Any]:
        body = self._get(key)
        meta = body["metadata"]
        if meta.get("finalizers"):
            if not meta.get("deletionTimestamp"):
                meta["deletionTimestamp"] = ko.now_rfc3339()
                self._commit(key, "MODIFIED", body)
            return body
        return self._remove(key, orphan=orphan)

    def _remove(self, key: Key, *, orphan: bool = False) -> dict[str, Any]:
        body = self._get(key)
        self._rv += 1
        body["metadata"]["resourceVersion"] = str(self._rv)
        self._objects[key].delete()
        self._record(key[0], "DELETED", body)
        if key[0] == CRDS:
            self._unregister_crd(body)
        if not orphan:
            self._collect_garbage(body["metadata"]["uid"])
        return body

    def _collect_garbage(self, gone_uid: str) -> None:
        live = {obj.raw["metadata"].get("uid") for obj in self._objects.values()
                if not obj.deleted}
        for key, obj in list(self._objects.items()):
            if not obj.deleted and ko.orphaned(obj.raw, gone_uid, live):
                self._delete_object(key)

    def _delete_collection(self, res: resource, request: Request) -> dict[str, Any]:
        gone = [self._delete_object(key) for key, body in self._select(res, request)]
        return self._list_body(res, gone)

    def _commit(self, key: Key, event: str, body: dict[str, Any]) -> None:
        self._rv += 1
        body["metadata"]["resourceVersion"] = str(self._rv)
        if key in self._objects:  # a new version in kmock's history of the object
            self._objects[key].create(copy.deepcopy(body))
        else:
            self._objects[key] = copy.deepcopy(body)
        self._record(key[0], event, body)

    def _record(self, res: resource, event: str, body: dict[str, Any]) -> None:
        self._log.append((res, {"type": event, "object": copy.deepcopy(body)}))
        self._log_rvs.append(self._rv)

    # --- reads ---------------------------------------------------------------------------

    async def _serve_fetch(self, request: Request) -> Any:
        res = self._known(request)
        if request.name is None:  # pragma: no cover  # kmock routes unnamed GETs to list
            raise ko.not_found(res, "")
        ns = request.namespace if self._namespaced(res) else None
        async with self._changed:
            body = self._get((res, ns, request.name))
            if oa.wants_table(request.headers.get("Accept")):
                return oa.table([body], self._columns.get(res), str(self._rv))
            return body

    async def _serve_list(self, request: Request) -> Any:
        res = self._known(request)
        async with self._changed:
            bodies = [body for _, body in self._select(res, request)]
            if oa.wants_table(request.headers.get("Accept")):
                return oa.table(bodies, self._columns.get(res), str(self._rv))
            page = self._list_body(res, bodies) if "limit" not in request.params \
                else self._list_page(res, bodies, request)
            self.lists.append((res.plural or "", request.params.get("labelSelector"),
                               request.params.get("limit"), len(page["items"])))
            return page

    def _list_page(self, res: resource, bodies: list[dict[str, Any]],
                   request: Request) -> dict[str, Any]:
        """One page of a list asked with ``limit``, in the API server's order (by
        namespace and name); its ``continue`` token is where the next page starts."""
        def key(body: Mapping[str, Any]) -> list[str]:
            meta = body.get("metadata", {})
            return [meta.get("namespace") or "", meta.get("name") or ""]

        bodies.sort(key=key)
        if token := request.params.get("continue"):
            after = json.loads(base64.b64decode(token))
            bodies = [b for b in bodies if key(b) > after]
        limit = int(request.params["limit"])
        page = self._list_body(res, bodies[:limit] if limit > 0 else bodies)
        if 0 < limit < len(bodies):
            page["metadata"]["continue"] = base64.b64encode(
                json.dumps(key(bodies[limit - 1])).encode()).decode()
            page["metadata"]["remainingItemCount"] = len(bodies) - limit
        return page

    async def _serve_version(self, request: Request) -> Any:
        # kmock names the core group-version "/v1"; kubectl then finds no kind in "v1".
        found = await super()._serve_version(request)
        if isinstance(found, dict) and str(found.get("groupVersion", "")).startswith("/"):
            found["groupVersion"] = found["groupVersion"][1:]
        # Subresources, as the apiserver lists them: no names of their own to match.
        for entry in found.get("resources", []) if isinstance(found, dict) else ():
            if "/" in entry.get("name", ""):
                entry.update(singularName="", shortNames=[], categories=[],
                             verbs=["get", "patch", "update"])
        return found

    async def _serve_openapi(self, request: Request) -> Any:
        path = request.url.path.rstrip("/")
        if path == "/openapi/v2":
            if "protobuf" in (request.headers.get("Accept") or ""):
                return Response(status=200, payload=b"")  # an empty Document message
            return oa.v2_document()
        if path == "/openapi/v3":
            return oa.v3_root(self._get_resources())
        if path.startswith("/openapi/v3/"):
            infos = {r: self._info(r) for r in self._get_resources()}
            return oa.v3_document(infos, self._schemas, path.removeprefix("/openapi/v3/"))
        raise NotImplementedError  # not OpenAPI: the next reaction serves it

    def _strict(self, res: resource, body: Mapping[str, Any]) -> None:
        """``fieldValidation=Strict``: unknown fields are an error, as in the apiserver."""
        problems = oa.strict_problems(body, self._schemas.get(res))
        if problems:
            raise ko.api_error(400, "BadRequest", "strict decoding error: "
                               + ", ".join(problems))

    async def _serve_watch(self, request: Request) -> AsyncIterator[Any]:
        yield b""  # send the headers now: a quiet watch must still count as started
        res = self._known(request)
        self.watches.append((res.plural or "", request.params.get("labelSelector")))
        loop = asyncio.get_running_loop()
        timeout = request.params.get("timeoutSeconds")
        deadline = loop.time() + float(timeout) if timeout else None
        since = request.params.get("resourceVersion") or "0"
        if not since.isdigit():
            raise ko.api_error(400, "BadRequest", f"resourceVersion {since!r} is not a number")
        async with self._changed:
            if since == "0":
                pending = [{"type": "ADDED", "object": body}
                           for _, body in self._select(res, request)]
                cursor = len(self._log)
            else:
                pending, cursor = [], bisect.bisect_right(self._log_rvs, int(since))
        for event in pending:
            yield event
        while True:
            async with self._changed:
                while cursor >= len(self._log) and not self._closing:
                    left = None if deadline is None else deadline - loop.time()
                    if left is not None and left <= 0:
                        return
                    try:
                        await asyncio.wait_for(self._changed.wait(), left)
                    except TimeoutError:
                        return
                if self._closing:
                    return
                batch, cursor = self._log[cursor:], len(self._log)
            for entry_res, entry in batch:
                if entry_res == res and self._matches(request, entry["object"]):
                    yield entry

    async def _serve_create(self, request: Request) -> Any:
        status, body = self._outcomes[request]
        return Response(status=status, payload=body)

    async def _serve_update(self, request: Request) -> Any:
        if request not in self._outcomes:
            raise ko.api_error(405, "MethodNotAllowed", "the server does not allow this method")
        status, body = self._outcomes[request]
        return Response(status=status, payload=body)

    _serve_delete = _serve_update

    async def _serve_server_version(self, request: Request) -> Any:
        major, minor = self.kube_version
        # client 37 validates VersionInfo with pydantic: every field must be a string.
        return {"major": str(major), "minor": str(minor), "gitVersion": f"v{major}.{minor}.0",
                "gitCommit": "0" * 40, "gitTreeState": "clean",
                "buildDate": "2025-01-01T00:00:00Z", "goVersion": "go1.24",
                "compiler": "gc", "platform": "linux/amd64"}

    def _select(self, res: resource, request: Request) -> list[tuple[Key, dict[str, Any]]]:
        return [(key, copy.deepcopy(obj.raw)) for key, obj in self._objects.items()
                if key[0] == res and not obj.deleted and self._matches(request, obj.raw)]

    def _matches(self, request: Request, body: Mapping[str, Any]) -> bool:
        meta = body.get("metadata", {})
        return bool(
            (request.namespace is None or meta.get("namespace") == request.namespace)
            and (request.name is None or meta.get("name") == request.name)
            and ko.matches_labels(meta.get("labels", {}), request.params.get("labelSelector"))
            and ko.matches_fields(body, request.params.get("fieldSelector")))

    def _list_body(self, res: resource, items: list[dict[str, Any]]) -> dict[str, Any]:
        return {"apiVersion": ko.api_version_of(res), "kind": f"{self._kind(res)}List",
                "metadata": {"resourceVersion": str(self._rv)}, "items": items}

    def _get(self, key: Key) -> dict[str, Any]:
        if key not in self._objects or self._objects[key].deleted:  # ObjectsArray has no .get
            raise ko.not_found(key[0], key[2], self._kind(key[0]))
        obj = self._objects[key]
        return copy.deepcopy(obj.raw)

    async def end_watches(self) -> None:
        """End every open watch stream, so that the HTTP server can stop without waiting."""
        async with self._changed:
            self._closing = True
            self._changed.notify_all()

    # --- resources and CRDs ---------------------------------------------------------------

    def _known(self, request: Request) -> resource:
        res = request.resource
        if res is None or not any(r == res for r in self._get_resources()):
            raise ko.api_error(404, "NotFound", "the server could not find the requested resource")
        return res

    def _info(self, res: resource) -> ResourceInfo:
        return self.resources[res] if res in self.resources else ResourceInfo()

    def _namespaced(self, res: resource) -> bool:
        return self._info(res).namespaced is not False

    def _kind(self, res: resource) -> str:
        return ko.kind_of(res, self._info(res))

    def _admit(self, res: resource, body: dict[str, Any]) -> dict[str, Any]:
        """Prune, default and validate as the apiserver does (custom objects by their CRD)."""
        if problems := object_problems(str(res.plural), body):
            raise ko.invalid(res, body["metadata"].get("name"), *problems,
                             kind=self._kind(res))
        store_quantities(str(res.plural), body)
        schema = self._schemas.get(res)
        if schema is None:
            return body
        body = apply_defaults(schema, prune(schema, body))
        if errors := (schema_errors(schema, body) + cel_errors(schema, body)
                      + list_map_errors(schema, body)):
            raise ko.invalid(res, body["metadata"].get("name"), *errors, kind=self._kind(res))
        return body

    def _register_crd(self, crd: Mapping[str, Any]) -> dict[str, Any]:
        spec, names = crd["spec"], crd["spec"]["names"]
        for version in spec["versions"]:
            if not version.get("served", True):
                continue
            res = resource(spec["group"], version["name"], names["plural"])
            self.resources[res] = ResourceInfo(
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                kind=names["kind"], singular=names.get("singular", names["kind"].lower()),
                verbs=ALL_VERBS, shortnames=names.get("shortNames", []),
                categories=names.get("categories", []),
                subresources=set(version.get("subresources", {})))
            if "schema" in version:
                self._schemas[res] = served_schema(crd, version["name"])
            self._columns[res] = list(version.get("additionalPrinterColumns") or [])
        return {"acceptedNames": dict(names), "storedVersions": [
            v["name"] for v in spec["versions"] if v.get("storage")], "conditions": [
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted"}]}

    def _unregister_crd(self, crd: Mapping[str, Any]) -> None:
        spec = crd["spec"]
        for version in spec["versions"]:
            res = resource(spec["group"], version["name"], spec["names"]["plural"])
            self._schemas.pop(res, None)
            self._columns.pop(res, None)
            if res in self.resources:
                del self.resources[res]

    async def install(self, *bodies: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Create objects (CRDs first, as ``kubectl apply`` would need) from test code."""
        out = []
        async with self._changed:
            for body in sorted(bodies, key=lambda b: b.get("kind") != "CustomResourceDefinition"):
                api_version, plural = str(body["apiVersion"]), self._plural(body)
                group, _, version = api_version.rpartition("/")
                res = resource(group, version, plural)
                namespace = body.get("metadata", {}).get("namespace")
                out.append(self._create_object(res, namespace, body))
            self._changed.notify_all()
        return out

    def _plural(self, body: Mapping[str, Any]) -> str:
        group = str(body["apiVersion"]).rpartition("/")[0]
        for res in self.resources:
            info = self.resources[res]
            if res.group == group and info.kind == body["kind"]:
                return str(res.plural)
        raise LookupError(f"no resource serves kind {body['kind']} in {body['apiVersion']}; "
                          "install its CustomResourceDefinition first")
