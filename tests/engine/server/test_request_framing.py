"""Request smuggling shapes at ``slopilot serve``'s edge (h11).

A request that says both ``Content-Length`` and ``Transfer-Encoding`` is framed one way
by a proxy that reads the length and another by a server that reads the encoding: the
bytes one takes for a body the other takes for a second request. RFC 9112 6.1 lets a
server refuse it or read it by its encoding, but either way it must close the connection
after answering, so nothing that followed on it is served as a request of its own.
"""

from __future__ import annotations

import json
import socket

from tests.support.live_server import LiveServer
from tests.support.waits import HANG_GUARD_S


def _until_closed(sock: socket.socket) -> bytes:
    sock.settimeout(HANG_GUARD_S)
    out = b""
    while got := sock.recv(65536):
        out += got
    return out


def test_a_request_with_both_a_length_and_an_encoding_is_refused_and_ends_the_connection(
        sim_server: LiveServer) -> None:
    body = json.dumps({"prompt": "hi", "max_tokens": 1}).encode()
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    # What a proxy that reads the length forwards as one request: its "body" holds the
    # chunked body and, after it, a request of the client's own to the server.
    hidden = b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n"
    sent = (b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\ntransfer-encoding: chunked\r\n\r\n"
            % len(chunked + hidden) + chunked + hidden)
    host, port = sim_server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(sent)
        answer = _until_closed(sock)  # returns only once the server closed it
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
    assert answer.count(b"HTTP/1.1 ") == 1, answer  # the hidden GET was never answered
