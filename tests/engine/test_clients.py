"""Client grants (``spec.clients``): which classes a key may name, and what is refused."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slopilot.engine.clients import (
    ANONYMOUS,
    ClientClasses,
    ClientRefused,
    ClientsError,
    Refusal,
    Served,
    read_clients_file,
)
from slopilot.engine.request import Priority
from slopilot.engine.watched_file import WatchedFile
from tests.support.client_keys import digest

KEY_A, KEY_B = "sk-team-a-0123456789abcdef0123", "sk-team-b-fedcba9876543210fedc"


def grants(**extra: Any) -> dict[str, Any]:
    return {"keys": [{"name": "checkout", "sha256": digest(KEY_A), "maxClass": "p0",
                      "defaultClass": "p0"},
                     {"name": "reports", "sha256": digest(KEY_B), "maxClass": "p1"}],
            **extra}


def test_a_granted_key_names_its_class_or_gets_its_default() -> None:
    c = ClientClasses.from_dict(grants())
    assert c.serve(f"Bearer {KEY_A}", Priority.P0) == Served("checkout", Priority.P0)
    assert c.serve(f"Bearer {KEY_A}", None) == Served("checkout", Priority.P0)
    assert c.serve(f"bearer  {KEY_B} ", Priority.P2) == Served("reports", Priority.P2)
    # No defaultClass: p1, as a request naming none is anywhere, within the grant.
    assert c.serve(f"Bearer {KEY_B}", None) == Served("reports", Priority.P1)


def test_a_class_above_the_grant_is_refused_naming_what_is_allowed() -> None:
    c = ClientClasses.from_dict(grants())
    with pytest.raises(ClientRefused) as caught:
        c.serve(f"Bearer {KEY_B}", Priority.P0)
    assert caught.value.reason is Refusal.CLASS_NOT_ALLOWED
    assert caught.value.client == "reports"
    assert "p1, p2" in caught.value.message and "not p0" in caught.value.message


@pytest.mark.parametrize("authorization", [None, "", "Bearer", "Bearer EMPTY",
                                          f"Basic {KEY_A}", f"Bearer {KEY_A}x", KEY_A])
def test_without_a_granted_key_a_request_is_refused_or_anonymous(
        authorization: str | None) -> None:
    closed = ClientClasses.from_dict(grants())
    with pytest.raises(ClientRefused) as caught:
        closed.serve(authorization, Priority.P2)
    assert caught.value.reason is Refusal.UNKNOWN_KEY
    assert "Authorization: Bearer" in caught.value.message
    # Served anonymously where that is granted: the SDKs' placeholder key included.
    open_ = ClientClasses.from_dict(grants(anonymous={"maxClass": "p2"}))
    assert open_.serve(authorization, None) == Served(ANONYMOUS, Priority.P2)
    with pytest.raises(ClientRefused, match="not p1"):
        open_.serve(authorization, Priority.P1)


def test_an_empty_key_is_no_key_and_its_digest_no_grant() -> None:
    """``printf %s $KEY | sha256sum`` with KEY unset digests the empty string; granted,
    that digest served every client whose Authorization said ``Bearer`` and no key (curl
    with the same unset variable, or any client that tries it)."""
    empty = hashlib.sha256(b"").hexdigest()
    with pytest.raises(ClientsError, match="an empty key") as caught:
        ClientClasses.from_dict({"keys": [{"name": "a", "sha256": empty, "maxClass": "p0"}]})
    assert caught.value.field == "clients.keys[0].sha256"


def test_bearer_and_no_key_never_matches_a_grant() -> None:
    c = ClientClasses.from_dict(grants(anonymous={"maxClass": "p2"}))
    # A grant whose digest is the empty string's, made as the parse refuses to: no key.
    key = c.keys[0]
    forged = ClientClasses((type(key)(key.name, hashlib.sha256(b"").digest(), key.grant),),
                           c.anonymous)
    for authorization in ("Bearer", "Bearer ", "bearer   "):
        assert forged.serve(authorization, None) == Served(ANONYMOUS, Priority.P2)


def test_anonymous_alone_caps_every_client() -> None:
    """No keys: nobody may name p0, the use of a deployment that never wants realtime."""
    c = ClientClasses.from_dict({"anonymous": {"maxClass": "p1"}})
    assert c.serve(None, None) == Served(ANONYMOUS, Priority.P1)
    with pytest.raises(ClientRefused):
        c.serve("Bearer anything", Priority.P0)


def test_the_document_round_trips() -> None:
    c = ClientClasses.from_dict(grants(anonymous={"maxClass": "p2"}))
    again = ClientClasses.from_dict(json.loads(json.dumps(c.to_dict())))
    assert again == c and again.to_dict() == c.to_dict()
    assert "sk-team" not in json.dumps(c.to_dict())  # digests only, never a key
    assert "sk-team" not in repr(c)


def bad_key(**fields: Any) -> dict[str, Any]:
    key = {"name": "a", "sha256": digest(KEY_A), "maxClass": "p1", **fields}
    return {"keys": [{k: v for k, v in key.items() if v is not None}]}


@pytest.mark.parametrize(("data", "field", "fix"), [
    ([], "clients", "expected an object"),
    ({"key": []}, "clients.key", "holds keys and anonymous"),
    ({"keys": {}}, "clients.keys", "expected a list"),
    ({"keys": []}, "clients", "refuse every request"),
    ({"keys": ["x"]}, "clients.keys[0]", "expected an object"),
    (bad_key(name=None), "clients.keys[0].name", "not a name"),
    (bad_key(name="Team A"), "clients.keys[0].name", "lower-case"),
    (bad_key(name="a" * 64), "clients.keys[0].name", "1 to 63"),
    (bad_key(name="anonymous"), "clients.keys[0].name", "pick another"),
    (bad_key(sha256=KEY_A), "clients.keys[0].sha256", "never the key"),
    (bad_key(sha256=None), "clients.keys[0].sha256", "64 hex digits"),
    (bad_key(maxClass=None), "clients.keys[0].maxClass", "missing"),
    (bad_key(maxClass="p3"), "clients.keys[0].maxClass", "use 0, 1, 2"),
    (bad_key(maxClass=True), "clients.keys[0].maxClass", "use p0, p1 or p2"),
    (bad_key(maxClass=10 ** 5000), "clients.keys[0].maxClass", "too large to show"),
    (bad_key(maxClass=[10 ** 5000]), "clients.keys[0].maxClass", "too large to show"),
    (bad_key(maxClass="p" * 10_000), "clients.keys[0].maxClass", "..."),
    (bad_key(defaultClass="p0"), "clients.keys[0].defaultClass", "more urgent than"),
    (bad_key(tier="gold"), "clients.keys[0].tier", "unknown field"),
    ({"keys": bad_key()["keys"] * 2}, "clients.keys[1].name", "also keys[0]'s"),
    ({"keys": [bad_key()["keys"][0], {**bad_key()["keys"][0], "name": "b"}]},
     "clients.keys[1].sha256", "one key has one grant"),
    ({"keys": [{"name": f"k{i}", "sha256": digest(str(i)), "maxClass": "p2"}
               for i in range(1025)]}, "clients.keys", "more than 1024"),
    ({"anonymous": "p2"}, "clients.anonymous", "expected an object"),
    ({"anonymous": {"maxClass": "p2", "defaultClass": "p1"}},
     "clients.anonymous.defaultClass", "more urgent than maxClass p2"),
])
def test_what_users_get_wrong_names_the_field_and_the_fix(data: Any, field: str,
                                                          fix: str) -> None:
    with pytest.raises(ClientsError) as caught:
        ClientClasses.from_dict(data)
    assert caught.value.field == field
    assert fix in str(caught.value)
    assert len(str(caught.value)) < 400  # a hostile value is never echoed whole


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.sampled_from(["keys", "anonymous", "name", "sha256",
                                                       "maxClass", "defaultClass"]),
                                      inner, max_size=4), max_leaves=12))
def test_any_json_is_grants_or_a_clients_error(data: Any) -> None:
    """Nothing else escapes (a TypeError, a RecursionError) for the server to answer 500."""
    with contextlib.suppress(ClientsError):
        ClientClasses.from_dict(data)



@pytest.mark.parametrize("where", ["name", "sha256", "maxClass"])
def test_a_value_nested_a_thousand_deep_is_named_not_a_recursion_error(where: str) -> None:
    """A JSON document 1000 levels deep is a few KB: quoted whole, its repr recursed past
    Python's limit, and the parse raised RecursionError instead of naming the field."""
    deep: Any = "x"
    for _ in range(1000):
        deep = {"a": deep}
    with pytest.raises(ClientsError) as caught:
        ClientClasses.from_dict(bad_key(**{where: deep}))
    assert caught.value.field == f"clients.keys[0].{where}"
    assert len(str(caught.value)) < 400

def test_the_file_is_read_again_when_it_changes_and_a_bad_version_keeps_the_last(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "clients.json"
    path.write_text(json.dumps(grants()))
    watched = WatchedFile(path, read_clients_file, "client grants", (ClientsError,))
    first = watched.current()
    assert watched.current() is first  # unchanged on disk: not read again
    path.write_text(json.dumps(grants(anonymous={"maxClass": "p2"})))
    second = watched.current()
    assert second.anonymous is not None and watched.changes == 1
    with caplog.at_level(logging.WARNING):
        path.write_text('{"keys": [')  # the kubelet's swap caught half way, or a bad edit
        assert watched.current() is second
        assert watched.current() is second
    assert sum("cannot be used" in r.message for r in caplog.records) == 1
    os.remove(path)
    assert watched.current() is second


def test_a_bad_file_at_the_start_names_the_file_and_the_field(tmp_path: Path) -> None:
    path = tmp_path / "clients.json"
    path.write_text(json.dumps(bad_key(maxClass="p7")))
    with pytest.raises(ClientsError, match=r"clients\.json: clients\.keys\[0\]\.maxClass"):
        read_clients_file(path)
    with pytest.raises(ClientsError, match="no such file"):
        read_clients_file(tmp_path / "missing.json")
    path.write_text("{")
    with pytest.raises(ClientsError, match="not valid JSON"):
        read_clients_file(path)


def test_a_key_beyond_ascii_matches_the_digest_of_its_utf8_bytes() -> None:
    """``printf %s KEY | sha256sum`` digests the key's UTF-8 bytes, which curl sends as
    they are; the server reads the header as HTTP and Starlette do, one character per
    byte (Latin-1). Digested again as UTF-8, ``é`` became two characters and four bytes,
    and a key with one never matched its own grant."""
    key = "sk-clé-ключ-0123456789"
    c = ClientClasses.from_dict({"keys": [{"name": "intl", "sha256": digest(key),
                                           "maxClass": "p1"}]})
    as_read = ("Bearer " + key).encode().decode("latin-1")  # what Starlette hands on
    assert c.serve(as_read, None) == Served("intl", Priority.P1)
    # A caller holding the key itself (no HTTP between) is served by the same grant.
    assert c.serve(f"Bearer {key}", None) == Served("intl", Priority.P1)
    with pytest.raises(ClientRefused):
        c.serve(("Bearer " + key[:-1]).encode().decode("latin-1"), None)
