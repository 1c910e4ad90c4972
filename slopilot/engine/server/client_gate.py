"""Client grants at the server's door (``slopilot serve --clients FILE``).

Without grants a class is the client's to name. With them (``clients.ClientClasses``,
read again from the file whenever it changes: the operator's ConfigMap is swapped in
place, and an edit applies without a restart) a request is checked twice, each time
where the answer is first known:

- its key, at the door of every ``/v1`` route (``ClientGate``), as vLLM's ``--api-key``
  checks it: before the body is read, so a client without a granted key learns nothing
  of the server, not even whether its body parses, and none of it is read for it;
- its class, where the server decides it (``serving.prepare``), from the body's
  ``priority`` or the header, by the version of the grants the door used (the request's
  scope carries it), so that an edit between the two never judges one request by two.

/health, /metrics and the admin app (its own token) are not behind the grants. A refusal
is the client's error, as a 400 is: it never reaches the engine, so it is no demand, no
refusal for load and no verdict; it is counted per client (``client_counts.py``).
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from slopilot.engine.clients import ClientClasses, ClientRefused, Refusal
from slopilot.engine.server.client_counts import ClientCounts
from slopilot.engine.server.errors import APIError
from slopilot.engine.watched_file import WatchedFile

SCOPE_KEY = "slopilot.clients"
"""The request scope's entry for the grants its key was checked by."""
_V1 = "/v1"


class GrantRefusal(APIError):
    """A request its client's grant does not allow, OpenAI-shaped: 401 ``invalid_api_key``
    (the SDKs raise AuthenticationError) or 403 ``priority_not_allowed``
    (PermissionDeniedError, which they do not retry); ``param`` names what the client used
    to name the class."""

    def __init__(self, refused: ClientRefused, param: str | None = None) -> None:
        if refused.reason is Refusal.UNKNOWN_KEY:
            super().__init__(401, refused.message, code="invalid_api_key",
                             headers={"WWW-Authenticate": "Bearer"})
        else:
            super().__init__(403, refused.message, param=param, code="priority_not_allowed")
        self.client, self.reason = refused.client, refused.reason


class ClientGrants:
    """The grants now, and the per-client counters they bound. Event loop only."""

    def __init__(self, watched: WatchedFile[ClientClasses], counts: ClientCounts) -> None:
        self.watched, self.counts = watched, counts
        self._seen: ClientClasses | None = None

    def current(self) -> ClientClasses:
        """The file's grants (a look at it, read again only if it changed)."""
        clients = self.watched.current()
        if clients is not self._seen:
            self._seen = clients
            self.counts.set_clients(clients)
        return clients


def grants_of(scope: Scope) -> ClientClasses | None:
    """The grants a request's key was checked by at the door; None: there are none."""
    clients: ClientClasses | None = scope.get(SCOPE_KEY)
    return clients


class ClientGate:
    """ASGI: a ``/v1`` request without a granted key (and no anonymous grant) is
    answered 401 before the app sees it; any other carries the grants on in its scope."""

    def __init__(self, app: ASGIApp, grants: ClientGrants) -> None:
        self.app, self.grants = app, grants

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope.get("path", "")
        if scope["type"] == "http" and (path == _V1 or path.startswith(_V1 + "/")):
            clients = self.grants.current()
            try:
                # Starlette's reading of the header (Latin-1, the first of several), as
                # serving.prepare reads it again with the class.
                clients.serve(Headers(scope=scope).get("authorization"), None)
            except ClientRefused as exc:
                self.grants.counts.count_refused(exc.client, exc.reason)
                await GrantRefusal(exc).response()(scope, receive, send)
                return
            scope[SCOPE_KEY] = clients
        await self.app(scope, receive, send)
