"""A throwaway CA, and an HTTPS stand-in Prometheus whose certificate it signed.

Made per test with the ``openssl`` command (no certificate lives in the repository): the
CA and the server's key are a test's own, in its ``tmp_path``, and valid for a day. The
stand-in answers every query with an empty vector, a valid Prometheus answer that both
``query_at`` and ``AlertSource`` read as nothing.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import ssl
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.support.waits import HANG_GUARD_S

EMPTY_VECTOR = b'{"status":"success","data":{"resultType":"vector","result":[]}}'
HOST = "127.0.0.1"


@dataclass(frozen=True)
class ThrowawayCA:
    ca_file: Path
    """The CA's certificate (PEM): what a client trusts."""
    cert_file: Path
    """The server's certificate, for ``HOST``, signed by the CA."""
    key_file: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True,
                   timeout=HANG_GUARD_S)


def throwaway_ca(where: Path) -> ThrowawayCA:
    """A CA and a server certificate for ``HOST`` it signed, under ``where``."""
    if shutil.which("openssl") is None:
        missing = "the openssl command makes the test's certificates; it is not installed"
        if os.environ.get("SLOPILOT_REQUIRE_OPENSSL") == "1":  # make test installs it
            pytest.fail(missing)
        pytest.skip(missing)
    where.mkdir(parents=True, exist_ok=True)
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "1",
             "-subj", "/CN=slopilot test CA",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=where)
    _openssl("req", *ec, "-keyout", "server.key", "-out", "server.csr",
             "-subj", f"/CN={HOST}", cwd=where)
    # What a strict verifier asks of a leaf (Python 3.13 sets VERIFY_X509_STRICT).
    (where / "server.ext").write_text(
        f"subjectAltName=IP:{HOST}\nbasicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
        "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n", encoding="ascii")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "server.pem", "-days", "1",
             "-extfile", "server.ext", cwd=where)
    return ThrowawayCA(where / "ca.pem", where / "server.pem", where / "server.key")


class _EmptyVector(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(EMPTY_VECTOR)))
        self.end_headers()
        self.wfile.write(EMPTY_VECTOR)


class _TLSServer(ThreadingHTTPServer):
    tls: ssl.SSLContext

    def get_request(self) -> tuple[Any, Any]:
        # The handshake runs on the request's own thread (its first read), so a client
        # that refuses the certificate never holds the accepting one.
        sock, addr = self.socket.accept()
        return self.tls.wrap_socket(sock, server_side=True,
                                    do_handshake_on_connect=False), addr

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client refusing the certificate is what some tests want


@contextlib.contextmanager
def https_prometheus(ca: ThrowawayCA) -> Iterator[str]:
    """The stand-in's ``https://`` URL while the block runs."""
    server = _TLSServer((HOST, 0), _EmptyVector)
    server.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.tls.load_cert_chain(ca.cert_file, ca.key_file)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://{HOST}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(HANG_GUARD_S)


def rewrite_in_place(path: Path, content: bytes) -> None:
    """Rewrite ``path``'s bytes in place (same inode), as a tool that writes the file it
    rotates does, and move its mtime a second on: two writes within one tick of the
    file system's clock would otherwise share an mtime, and a same-sized bundle would
    look unchanged (a real rotation is minutes apart, never that close)."""
    before = path.stat().st_mtime_ns
    path.write_bytes(content)
    os.utime(path, ns=(before + 1_000_000_000, before + 1_000_000_000))


def swap_in(path: Path, content: bytes) -> None:
    """Replace ``path`` by a new file (a new inode), as the kubelet updates a ConfigMap
    or Secret volume: the new bytes are written aside and renamed over it."""
    aside = path.with_name(path.name + ".new")
    aside.write_bytes(content)
    os.replace(aside, path)
