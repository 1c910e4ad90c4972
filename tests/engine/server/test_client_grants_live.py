"""Client grants on a live server, as the official openai client meets them: served,
403 (PermissionDeniedError, never retried), 401 (AuthenticationError), the anonymous
grant, and the grants file edited under the running server."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from slopilot.engine.clients import ClientsError, read_clients_file
from slopilot.engine.slo import SLOSpec
from slopilot.engine.watched_file import WatchedFile
from tests.engine.server.test_client_grants import CHECKOUT, REPORTS, digest, grants
from tests.support.live_server import LiveServer, build_backend, start_server
from tests.support.waits import HANG_GUARD_S


def replace(path: Path, text: str) -> None:
    """Swap the file's contents as the kubelet swaps a ConfigMap volume's: a new file
    renamed over the old (a new inode, so seen as changed however fast the edits)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


@pytest.fixture
def live(tmp_path: Path) -> Iterator[tuple[LiveServer, Path]]:
    path = tmp_path / "clients.json"
    path.write_text(json.dumps(grants()))
    watched = WatchedFile(path, read_clients_file, "client grants", (ClientsError,))
    backend = build_backend()
    backend.metrics.set_slo(SLOSpec.from_profile("relaxed"))
    with start_server(backend, clients=watched) as srv:
        yield srv, path


def client(srv: LiveServer, key: str, **kw: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key=key, timeout=HANG_GUARD_S, **kw)


def ask(c: openai.OpenAI, srv: LiveServer, **kw: Any) -> Any:
    return c.completions.create(model=srv.backend.served_model_name, prompt="hello",
                                max_tokens=2, **kw)


SERVED = ("slopilot_client_requests_total", "client", "priority_class")
REFUSED = ("slopilot_client_refusals_total", "client", "reason")
LOAD = ("slopilot_requests_refused_total", "priority_class")


def series(srv: LiveServer, name: str, *labels: str) -> dict[tuple[str, ...], float]:
    """``name``'s samples on the server's /metrics, by the values of ``labels``."""
    text = httpx.get(srv.url + "/metrics", timeout=HANG_GUARD_S).text
    return {tuple(s.labels[k] for k in labels): s.value
            for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == name}


def test_the_openai_client_is_served_refused_and_told_why(
        live: tuple[LiveServer, Path]) -> None:
    srv, _ = live
    res = ask(client(srv, CHECKOUT), srv, extra_body={"priority": "p0"})
    assert res.choices[0].text
    # The SDK retries 408, 409, 429 and 5xx (max_retries=2 here, its default): never a
    # 403, which a retry cannot change. Counted once, so sent once.
    with pytest.raises(openai.PermissionDeniedError) as denied:
        ask(client(srv, REPORTS, max_retries=2), srv, extra_body={"priority": "p0"})
    body = denied.value.body
    assert isinstance(body, dict) and body["code"] == "priority_not_allowed"
    assert body["param"] == "priority"
    with pytest.raises(openai.AuthenticationError) as unknown:
        client(srv, "EMPTY", max_retries=2).models.list()
    assert isinstance(unknown.value.body, dict)
    assert unknown.value.body["code"] == "invalid_api_key"
    refusals = series(srv, *REFUSED)
    assert refusals[("reports", "class_not_allowed")] == 1
    assert refusals[("anonymous", "unknown_key")] == 1
    assert series(srv, *SERVED)[("checkout", "p0")] == 1
    # Neither refusal is demand: nothing turned away for load, nothing judged but the one
    # request served.
    assert all(v == 0 for v in series(srv, *LOAD).values())
    judged = series(srv, "slopilot_slo_requests_total", "priority_class", "met")
    # Judged once, as P0; whether it met the SLO is the machine's speed (a busy CI
    # runner's served it past P0's TTFT target), which this test is not about.
    assert sum(judged.values()) == 1 and judged["p0", "true"] + judged["p0", "false"] == 1


def test_an_edit_of_the_file_applies_to_the_next_request(
        live: tuple[LiveServer, Path]) -> None:
    srv, path = live
    with pytest.raises(openai.AuthenticationError):
        ask(client(srv, "EMPTY", max_retries=0), srv)
    # The anonymous grant added, and the reports key raised to p0, under the running server.
    raised = grants(anonymous={"maxClass": "p2"})
    raised["keys"][1]["maxClass"] = "p0"
    replace(path, json.dumps(raised))
    assert ask(client(srv, "EMPTY"), srv).choices[0].text
    assert ask(client(srv, REPORTS), srv, extra_body={"priority": 0}).choices[0].text
    # A half-written version (the swap caught mid-way, or a bad edit) keeps the grants.
    replace(path, json.dumps(grants())[:40])
    assert ask(client(srv, "EMPTY"), srv).choices[0].text
    # The checkout key removed: it is a key nobody granted now, and its series go.
    replace(path, json.dumps({"keys": [{"name": "reports", "sha256": digest(REPORTS),
                                        "maxClass": "p1"}]}))
    with pytest.raises(openai.AuthenticationError):
        ask(client(srv, CHECKOUT, max_retries=0), srv)
    assert not any(k[0] == "checkout" for k in series(srv, *SERVED))
    assert series(srv, *SERVED)[("reports", "p0")] == 1


@pytest.mark.parametrize(("authorization", "status"), [
    (b"Bearer " + b"k" * 100_000, 401),
    ("Bearer cl\u00e9".encode(), 401),
    (b"Bearer", 401),
])
def test_a_hostile_key_on_the_wire_is_refused_and_counted_as_no_demand(
        live: tuple[LiveServer, Path], authorization: bytes, status: int) -> None:
    srv, _ = live
    res = httpx.post(srv.url + "/v1/completions", json={"prompt": "hi", "priority": 0},
                     headers=[(b"authorization", authorization)], timeout=HANG_GUARD_S)
    assert res.status_code == status, res.text
    assert all(v == 0 for v in series(srv, *SERVED).values())
    assert all(v == 0 for v in series(srv, *LOAD).values())


def test_a_key_beyond_ascii_sent_as_curl_sends_it_is_served_by_its_grant(
        live: tuple[LiveServer, Path]) -> None:
    """curl sends a typed key's UTF-8 bytes; the grant holds ``printf %s KEY |
    sha256sum``, the digest of the same bytes (it never matched before: the server
    digested the header's Latin-1 reading re-encoded as UTF-8)."""
    srv, path = live
    key = "sk-clé-ключ-0123456789"
    with_intl = grants()
    with_intl["keys"].append({"name": "intl", "sha256": digest(key), "maxClass": "p1"})
    replace(path, json.dumps(with_intl))
    res = httpx.post(srv.url + "/v1/completions",
                     json={"prompt": "hi", "max_tokens": 2, "priority": "p1"},
                     headers=[(b"authorization", ("Bearer " + key).encode())],
                     timeout=HANG_GUARD_S)
    assert res.status_code == 200, res.text
    assert series(srv, *SERVED)[("intl", "p1")] == 1
