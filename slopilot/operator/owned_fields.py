"""The fields of an owned object the operator owns whole, though its render may leave
them out: a live value the render does not hold is drift, and the patch removes it.

The drift check (``reconcile.covers``) asks only that the live object carry every
rendered field, since the API server and admission add their own (a pod spec's
``schedulerName``, ``dnsPolicy``, ``terminationGracePeriodSeconds``); and a JSON merge
patch keeps every key it does not name. So a field the render stopped writing (a
priority class the administrator revoked and the tenant took out of
``spec.scheduling``) was neither seen nor sent, and stayed on the pods for good. The
paths below are the operator's alone: no API server default or other controller
writes them on these objects, so a value the render lacks is the operator's own stale
one, or a hand edit, and is sent as a null. Anything not listed is left to whoever
wrote it.

An entry is a field (present in the render, or removed whole) or, ``keyed``, a map whose
keys are owned one by one too (each live key the render lacks is sent as a null). A list
needs nothing more: a merge patch replaces a list whole.

``OWNED_WHOLE``: fields where a live value that merely carries the render's is drift too
(a NetworkPolicy's, where a field more admits more), compared whole.

``SCHEMA_MAY_LACK``: rendered fields an older CRD of the kind does not know, which the API
server prunes as it stores the object: absent from the live object, they are not drift
(a different value is), or every compare patched the object again for nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from slopilot.operator.scrape_limits import LIMIT_FIELDS


class Owned(NamedTuple):
    path: tuple[str, ...]
    keyed: bool = False


_POD = ("spec", "template", "spec")

OWNED_OPTIONAL: Mapping[str, tuple[Owned, ...]] = {
    # An owned ConfigMap's files: a grants file after spec.clients was removed. The
    # operator alone writes these maps, so a key it did not render is its own stale one.
    "ConfigMap": (Owned(("data",), keyed=True),),
    # spec.scheduling and the default spread (scheduling.pod_placement): what the
    # operator's policy judged must be all the pods get, a revoked class or toleration
    # included. Not affinity, which the operator never renders nor claims.
    "Deployment": (Owned(_POD + ("nodeSelector",), keyed=True),
                   Owned(_POD + ("tolerations",)),
                   Owned(_POD + ("priorityClassName",)),
                   Owned(_POD + ("topologySpreadConstraints",))),
    # policy/v1 refuses both set (422): the budget's one field is the render's.
    "PodDisruptionBudget": (Owned(("spec", "minAvailable")),
                            Owned(("spec", "maxUnavailable"))),
    # Which pods the policy guards: a label added or an expression narrows it to fewer,
    # and the rest are open to the cluster (OWNED_WHOLE judges it; these send the nulls).
    "NetworkPolicy": (Owned(("spec", "podSelector", "matchLabels"), keyed=True),
                      Owned(("spec", "podSelector", "matchExpressions")),
                      Owned(("spec", "egress"))),
    # The scrape limits (scrape_limits.py): a limit a later render leaves out goes, so a
    # stale one cannot fail the scrapes of a deployment that now exports more.
    "ServiceMonitor": tuple(Owned(("spec", field)) for field in LIMIT_FIELDS),
}

OWNED_WHOLE: Mapping[str, tuple[tuple[str, ...], ...]] = {
    # A NetworkPolicy's sources: ``covers`` asks only that the live object carry each
    # rendered field, and a peer with a field more (a namespaceSelector beside the
    # namespace's own podSelector: every namespace's pods) or a rule without ``from``
    # admits more, not less. The API server adds nothing there (the protocol, its one
    # default, is rendered), so anything but the render is drift.
    "NetworkPolicy": (("spec",),),
}


SCHEMA_MAY_LACK: Mapping[str, tuple[tuple[str, ...], ...]] = {
    # prometheus-operator's ServiceMonitor CRD took bodySizeLimit in v0.73.0; an older one
    # prunes it, and the other limits hold (docs/operations.md, "Scrape limits").
    "ServiceMonitor": (("spec", "bodySizeLimit"),),
}


def _at(obj: Any, path: tuple[str, ...]) -> tuple[bool, Any]:
    for part in path:
        if not isinstance(obj, Mapping) or part not in obj:
            return False, None
        obj = obj[part]
    return True, obj


def removals(desired: Mapping[str, Any], live: Mapping[str, Any]) -> dict[str, Any]:
    """The nulls a merge patch of ``desired`` needs to take off ``live`` what the render
    no longer holds, nested as the object is (empty: nothing to take off)."""
    out: dict[str, Any] = {}
    for path, keyed in OWNED_OPTIONAL.get(str(desired.get("kind")), ()):
        has_live, live_value = _at(live, path)
        if not has_live or live_value is None:
            continue
        has_desired, desired_value = _at(desired, path)
        if not has_desired:
            nulls: Any = None
        elif keyed and isinstance(live_value, Mapping) and isinstance(desired_value, Mapping):
            nulls = dict.fromkeys(sorted(set(live_value) - set(desired_value)))
            if not nulls:
                continue
        else:
            continue  # rendered: the covers() check and the patch's own value see to it
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = nulls
    return out


def without_unknown(desired: Mapping[str, Any], live: Mapping[str, Any]) -> dict[str, Any]:
    """``desired`` less the fields of ``SCHEMA_MAY_LACK`` that ``live`` does not carry:
    what the live object can be expected to cover."""
    out = dict(desired)
    for path in SCHEMA_MAY_LACK.get(str(desired.get("kind")), ()):
        if _at(live, path)[0] or not _at(desired, path)[0]:
            continue
        node = out
        for part in path[:-1]:
            node[part] = dict(node[part])
            node = node[part]
        del node[path[-1]]
    return out


def whole_differs(desired: Mapping[str, Any], live: Mapping[str, Any]) -> bool:
    """Whether a field of ``OWNED_WHOLE`` is not in ``live`` as rendered (a selector's
    empty ``matchLabels`` or ``matchExpressions``, which the API server drops as it
    stores it, read as absent on both sides)."""
    return any(_without_empty_selectors(_at(live, path)) !=
               _without_empty_selectors(_at(desired, path))
               for path in OWNED_WHOLE.get(str(desired.get("kind")), ()))


def _without_empty_selectors(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _without_empty_selectors(v) for k, v in value.items()
                if not (k in _SELECTOR_PARTS and not v)}
    if isinstance(value, (list, tuple)):
        return [_without_empty_selectors(v) for v in value]
    return value


_SELECTOR_PARTS = frozenset({"matchLabels", "matchExpressions"})


def with_removals(patch: Mapping[str, Any], nulls: Mapping[str, Any]) -> dict[str, Any]:
    """``patch`` with ``nulls`` (``removals``) laid in; a key of the patch's own wins."""
    out = dict(patch)
    for key, value in nulls.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = with_removals(out[key], value)
        elif key not in out:
            out[key] = value
    return out
