"""Which priority classes a client may name: its API key's grant, checked per request.

Without it a class is the client's to name, as in vLLM: any request saying ``p0`` is
admitted as P0, counted in P0's SLO, and may preempt P1 and P2. On a deployment whose
clients are not equally trusted (several teams behind one endpoint), one client naming
every request P0 takes the latency the others were promised. A ``ClientClasses`` (an
LLMDeployment's ``spec.clients``, or the engine's ``--clients`` file in the same shape)
grants each API key a most urgent class it may name and the class it gets when it names
none; a request presenting no known key gets the ``anonymous`` grant, or is refused
where there is none.

Keys are held as their SHA-256 only, as the admin token is (``admin_credential.py``): the
document may sit in a ConfigMap, readable by whoever reads the deployment, and a digest
of a random key lets nobody present it. A key must therefore be random (128 bits or
more): a digest of a guessable one can be searched.

No fastapi here: the operator parses ``spec.clients`` with this module.
"""

from __future__ import annotations

import enum
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slopilot.engine.bounded_read import read_bounded
from slopilot.engine.json_keys import DuplicateKey, loads_unique
from slopilot.engine.read_errors import unreadable
from slopilot.engine.request import Priority
from slopilot.engine.sim.quote import excerpt

MAX_KEYS = 1024
"""More keys than any one deployment's clients need; each is a digest checked per request."""
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")
_EMPTY_DIGEST = hashlib.sha256(b"").hexdigest()
_GRANT_FIELDS = frozenset({"maxClass", "defaultClass"})
_KEY_FIELDS = _GRANT_FIELDS | {"name", "sha256"}
_FIELDS = frozenset({"keys", "anonymous"})


class ClientsError(ValueError):
    """``spec.clients`` (or a ``--clients`` file) cannot be used; ``field`` is the path of
    the value at fault (``keys[2].sha256``), and the message names it, the value and
    the fix."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(f"{field}: {detail}")
        self.field, self.detail = field, detail


class Refusal(enum.Enum):
    """Why a request's client may not be served as it asked (the HTTP answer's reason)."""

    UNKNOWN_KEY = "unknown_key"
    """No key, or one not granted, where nothing is granted without one: 401."""
    CLASS_NOT_ALLOWED = "class_not_allowed"
    """A class more urgent than the key's grant: 403."""


class ClientRefused(Exception):
    """The request may not be served as asked; ``message`` says what would be."""

    def __init__(self, reason: Refusal, message: str, client: str) -> None:
        super().__init__(message)
        self.reason, self.message, self.client = reason, message, client


@dataclass(frozen=True, slots=True)
class Grant:
    """The classes a client may name: ``max_class`` and every less urgent one; it gets
    ``default_class`` when it names none."""

    max_class: Priority
    default_class: Priority

    @classmethod
    def from_dict(cls, data: Any, where: str) -> Grant:
        _object(data, where)
        if "maxClass" not in data:
            raise ClientsError(f"{where}.maxClass", "missing: the most urgent class this "
                               "client may name (p0, p1 or p2)")
        most = _class(data["maxClass"], f"{where}.maxClass")
        # Unnamed, a request is P1 (serving.py), but never more urgent than the grant.
        default = max(most, Priority.P1)
        if "defaultClass" in data:
            default = _class(data["defaultClass"], f"{where}.defaultClass")
            if default < most:
                raise ClientsError(f"{where}.defaultClass", f"{default.label} is more urgent "
                                   f"than maxClass {most.label}; name {most.label} or a "
                                   "less urgent class")
        return cls(most, default)

    def to_dict(self) -> dict[str, str]:
        return {"maxClass": self.max_class.label, "defaultClass": self.default_class.label}

    def allows(self, priority: Priority) -> bool:
        return priority >= self.max_class


@dataclass(frozen=True, slots=True)
class ClientKey:
    """One API key's grant, the key held as its SHA-256."""

    name: str
    sha256: bytes
    grant: Grant

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "sha256": self.sha256.hex(), **self.grant.to_dict()}


ANONYMOUS = "anonymous"
"""The client name of a request that presented no granted key (``Served.client``)."""


@dataclass(frozen=True, slots=True)
class Served:
    """Whom a request is served for, and in which class."""

    client: str
    priority: Priority


@dataclass(frozen=True)
class ClientClasses:
    """The grants of one deployment's clients (``spec.clients``)."""

    keys: tuple[ClientKey, ...]
    anonymous: Grant | None
    """The grant of a request without a granted key; None: it is refused (401)."""
    _by_digest: dict[bytes, ClientKey] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_digest", {k.sha256: k for k in self.keys})

    @classmethod
    def from_dict(cls, data: Any) -> ClientClasses:
        """``spec.clients``; ClientsError naming the field at fault."""
        _object(data, "clients")
        unknown = sorted(set(data) - _FIELDS)
        if unknown:
            raise ClientsError(f"clients.{unknown[0]}", "unknown field; spec.clients "
                               "holds keys and anonymous")
        raw_keys = data.get("keys", [])
        if not isinstance(raw_keys, list):
            raise ClientsError("clients.keys", f"expected a list of keys, got "
                               f"{_kind(raw_keys)}")
        if len(raw_keys) > MAX_KEYS:
            raise ClientsError("clients.keys", f"{len(raw_keys)} keys, more than {MAX_KEYS}; "
                               "give clients that share a grant one key")
        keys = tuple(_key(k, f"clients.keys[{i}]") for i, k in enumerate(raw_keys))
        names: dict[str, int] = {}
        digests: dict[bytes, int] = {}
        for i, k in enumerate(keys):
            if k.name in names:
                raise ClientsError(f"clients.keys[{i}].name", f"{k.name!r} is also "
                                   f"keys[{names[k.name]}]'s; give each key its own name")
            if k.sha256 in digests:
                raise ClientsError(f"clients.keys[{i}].sha256", f"the same key as "
                                   f"keys[{digests[k.sha256]}]; one key has one grant")
            names[k.name], digests[k.sha256] = i, i
        anonymous = data.get("anonymous")
        grant = None if anonymous is None else Grant.from_dict(anonymous, "clients.anonymous")
        if not keys and grant is None:
            raise ClientsError("clients", "no keys and no anonymous grant would refuse "
                               "every request; add keys, or anonymous: {maxClass: p2}")
        return cls(keys, grant)

    def to_dict(self) -> dict[str, Any]:
        """``spec.clients``'s shape: ``from_dict(to_dict())`` is the same grants."""
        out: dict[str, Any] = {"keys": [k.to_dict() for k in self.keys]}
        if self.anonymous is not None:
            out["anonymous"] = self.anonymous.to_dict()
        return out

    def serve(self, authorization: str | None, named: Priority | None) -> Served:
        """The class a request is served in: ``named`` (None: it named none) under the
        grant of the key in its ``Authorization: Bearer`` header.

        A key that is not granted is a request without one: where anonymous requests are
        served, a client sending the SDKs' placeholder key (``EMPTY``) is one. Raises
        ClientRefused where the request may not be served as asked.
        """
        key = self._key_of(authorization)
        if key is None:
            if self.anonymous is None:
                raise ClientRefused(Refusal.UNKNOWN_KEY, "this deployment serves only "
                                    "clients with a granted API key: send it as "
                                    "'Authorization: Bearer <key>'", ANONYMOUS)
            return _served(ANONYMOUS, self.anonymous, named)
        return _served(key.name, key.grant, named)

    def _key_of(self, authorization: str | None) -> ClientKey | None:
        scheme, _, given = (authorization or "").partition(" ")
        given = given.strip()
        # "Bearer" and nothing is what a client sends from an unset variable: no key.
        if scheme.lower() != "bearer" or not given:
            return None
        # A lookup by digest: what its timing could tell is where a digest lies, which
        # is of no help in finding a key.
        for raw in _key_bytes(given):
            if (key := self._by_digest.get(hashlib.sha256(raw).digest())) is not None:
                return key
        return None


def _key_bytes(given: str) -> tuple[bytes, ...]:
    """The bytes a key may have been sent as. A header as HTTP servers read it (Starlette:
    Latin-1, one character per byte) encodes back to the bytes on the wire, which are a
    key's UTF-8 where the client sent it as typed (curl); a key handed over as text (no
    HTTP between) is its UTF-8. ``printf %s KEY | sha256sum`` digests the UTF-8."""
    utf8 = given.encode()
    try:
        wire = given.encode("latin-1")
    except UnicodeEncodeError:
        return (utf8,)
    return (wire,) if wire == utf8 else (wire, utf8)


def _served(client: str, grant: Grant, named: Priority | None) -> Served:
    if named is None:
        return Served(client, grant.default_class)
    if not grant.allows(named):
        allowed = ", ".join(p.label for p in Priority if grant.allows(p))
        raise ClientRefused(Refusal.CLASS_NOT_ALLOWED, f"client {client!r} may name "
                            f"{allowed} (not {named.label}); ask the deployment's owner for "
                            "a key granted a more urgent class", client)
    return Served(client, named)


CLIENTS_FILE_BYTES = 1 << 20
"""The most of a grants file read: the operator writes it from ``spec.clients`` into a
ConfigMap (at most 1 MiB)."""


def read_clients_file(path: Path) -> ClientClasses:
    """The grants in the JSON file ``path`` (``spec.clients``'s shape); ClientsError
    naming the file where it cannot be read, is not JSON, or is not grants."""
    try:
        data = loads_unique(read_bounded(path, CLIENTS_FILE_BYTES).decode("utf-8"))
    except DuplicateKey as exc:
        raise ClientsError(str(path), str(exc)) from None
    except OSError as exc:
        raise ClientsError(str(path), unreadable(exc)) from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise ClientsError(str(path), f"not valid JSON: {exc}") from None
    try:
        return ClientClasses.from_dict(data)
    except ClientsError as exc:
        raise ClientsError(f"{path}: {exc.field}", exc.detail) from None


def _key(data: Any, where: str) -> ClientKey:
    _object(data, where)
    unknown = sorted(set(data) - _KEY_FIELDS)
    if unknown:
        raise ClientsError(f"{where}.{unknown[0]}", "unknown field; a key has name, sha256, "
                           "maxClass and defaultClass")
    name = data.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ClientsError(f"{where}.name", f"{_shown(name)} is not a name: lower-case "
                           "letters, digits and '-', 1 to 63, starting and ending with a "
                           "letter or digit (it labels the client's refusals)")
    if name == ANONYMOUS:
        raise ClientsError(f"{where}.name", f"{name!r} is the name of requests without a "
                           "key; pick another")
    digest = data.get("sha256")
    text = digest.strip().lower() if isinstance(digest, str) else None
    if text is None or not _HEX_DIGEST.fullmatch(text):
        raise ClientsError(f"{where}.sha256", f"{_shown(digest)} is not a SHA-256: expected "
                           "the key's digest as 64 hex digits (`printf %s KEY | sha256sum`), "
                           "never the key")
    if text == _EMPTY_DIGEST:
        raise ClientsError(f"{where}.sha256", "the SHA-256 of an empty key (was KEY unset "
                           "in `printf %s KEY | sha256sum`?); digest the key itself")
    return ClientKey(name, bytes.fromhex(text), Grant.from_dict(
        {k: v for k, v in data.items() if k in _GRANT_FIELDS}, where))


def _class(value: Any, where: str) -> Priority:
    # Bounded before Priority.parse: it quotes the value, and str() of an int of
    # thousands of digits raises.
    short = (isinstance(value, str) and len(value) <= 16) or \
        (isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 2)
    if not short:
        raise ClientsError(where, f"{_shown(value)} is not a class; use p0, p1 or p2")
    try:
        return Priority.parse(value)
    except ValueError as exc:
        raise ClientsError(where, str(exc)) from None


def _object(data: Any, where: str) -> None:
    if not isinstance(data, Mapping):
        raise ClientsError(where, f"expected an object, got {_kind(data)}")


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _shown(value: Any) -> str:
    if isinstance(value, int) and value.bit_length() > 64:
        return "an integer too large to show"  # repr() of thousands of digits raises
    # Bounded while built: repr() of an object nested 1000 deep (a few KB of JSON)
    # raises RecursionError.
    try:
        return excerpt(value)
    except ValueError:  # such an integer inside a list or an object
        return "a value too large to show"
