"""Fixes to kmock 0.8 that the emulator needs, kept apart from the apiserver rules.

- Routing: kmock decides whether a reaction's view holds a request by iterating the view,
  i.e. every request served so far, for every reaction: quadratic in a test's length (40
  tuning CRs made single polls take a minute). ``route`` judges plain filter chains on
  the request alone.
- Paths: kmock reads ``/api/v1/namespaces[/x]`` as the namespace prefix of another
  resource (and fails on the first), so kubectl could not apply a Namespace.
- ``Fault``: a write the emulator refuses on purpose (``KubeEmulator.fail``).
"""

from __future__ import annotations

from typing import Any

import aiohttp.web
import attrs
from kmock import Request
from kmock._internal import dsl, parsing
from kmock._internal.rendering import ReactionMismatchError

_kmock_parse_path = parsing.parse_path


def _parse_path(path: str) -> parsing.ParsedPath:
    """kmock's path parser, except for the Namespace resource itself.

    kmock reads ``/api/v1/namespaces`` and ``/api/v1/namespaces/x`` as the namespace
    prefix of some other resource (and fails on the first): kubectl's ``apply`` of a
    Namespace came back as a 500.
    """
    parts = path.strip("/").split("/")
    if parts[:2] == ["api", "v1"] and len(parts) >= 3 and parts[2] == "namespaces" and (
            len(parts) <= 4 or parts[4] in ("status", "finalize")):
        return parsing.ParsedPath("", "v1", "namespaces", None,
                                  parts[3] if len(parts) > 3 else None,
                                  parts[4] if len(parts) > 4 else None)
    return _kmock_parse_path(path)


parsing.parse_path = _parse_path


def _member(view: Any, request: Request) -> bool:
    """Whether ``request`` is in ``view``, judged on the request for plain filter chains."""
    node = view
    while True:
        if isinstance(node, dsl.Root):
            return True  # every request is appended to the root before it is routed
        if type(node) is dsl.Filter:
            if not node.criteria(request):
                return False
        elif type(node) is not dsl.Priority:
            return request in view  # kmock's own (scanning) judgement
        node = node._source


@attrs.define
class Fault:
    """The next ``times`` writes (``method`` on ``plural``[/``subresource``]) fail."""

    method: str
    plural: str
    subresource: str | None
    status: int
    times: int


async def route(handler: Any, request: Request) -> aiohttp.web.StreamResponse:
    """kmock's reaction routing, without its scan of every past request.

    kmock decides whether a reaction's view holds the request by iterating the view,
    i.e. every request served so far, for every reaction: quadratic in the length of
    a test. Views made of filters and priorities (all that this project registers)
    are judged on the request alone; anything fancier (slices, groups) still scans.
    """
    priorities = [p.priorities for p in handler._payloads]
    width = max((len(p) for p in priorities), default=0)
    keys = [tuple(-x for x in p) + (0,) * (width - len(p)) for p in priorities]
    for index in sorted(range(len(keys)), key=keys.__getitem__):
        payload = handler._payloads[index]
        if payload._disabled.is_set() or not _member(payload._source, request):
            continue
        try:
            return await payload(request)  # type: ignore[no-any-return]
        except ReactionMismatchError:
            payload._disabled.set()
        except NotImplementedError:
            pass
    raise NotImplementedError("no reaction matches the request")
