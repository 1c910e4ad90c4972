"""The files ``slopilot serve`` reads at its start and again when they change: the SLO
(``--slo``, the ConfigMap's), the client grants (``--clients``), the knobs (``--config``)
and the admin token (``--admin-token-file``). Each was read with ``read_text``: a path to
``/dev/zero`` (or a link to it) read until memory ran out, and one to a named pipe waited
for a writer for ever, the server never starting. Read through ``bounded_read`` now, as a
profile, scenario or trace is: a clear refusal, at once."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from slopilot.engine.clients import ClientsError, read_clients_file
from slopilot.engine.config import ConfigError
from slopilot.engine.server.commands import _knobs, admin_token
from slopilot.engine.slo import SLOError, read_slo_file


def _config(path: Path) -> object:
    return _knobs(argparse.Namespace(config=path, set=[]))


READERS: list[tuple[str, Callable[[Path], object], type[Exception]]] = [
    ("slo", read_slo_file, SLOError),
    ("clients", read_clients_file, ClientsError),
    ("config", _config, ConfigError),
    ("token", admin_token, ValueError),
]


@pytest.fixture(params=["device", "link to a device", "pipe"])
def not_a_file(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    if request.param == "device":
        return Path("/dev/zero")
    if request.param == "link to a device":
        link = tmp_path / "looks-like.json"
        link.symlink_to("/dev/zero")
        return link
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    return fifo


@pytest.mark.parametrize(("what", "read", "error"), READERS, ids=[r[0] for r in READERS])
def test_a_path_that_is_no_file_is_refused_unread(
        what: str, read: Callable[[Path], object], error: type[Exception],
        not_a_file: Path) -> None:
    with pytest.raises(error, match="not a regular file"):
        read(not_a_file)


@pytest.mark.parametrize(("what", "read", "error"), READERS, ids=[r[0] for r in READERS])
def test_a_file_past_its_bound_is_refused_unread(
        what: str, read: Callable[[Path], object], error: type[Exception],
        tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    with big.open("wb") as fh:
        fh.truncate(64 << 20)  # sparse: 64 MiB said, nothing written
    with pytest.raises(error, match="past the"):
        read(big)


_TWICE = {
    "slo": '{"profile": "strict", "classes": {"p0": {"ttft_p99_ms": 900, '
           '"ttft_p99_ms": 9000}}}',
    "clients": '{"anonymous": {"maxClass": "p2"}, "anonymous": {"maxClass": "p0"}}',
    "config": '{"token_budget": 512, "max_num_seqs": 8, "token_budget": 4096}',
}


@pytest.mark.parametrize(("what", "read", "error"), READERS[:3],
                         ids=[r[0] for r in READERS[:3]])
def test_a_key_given_twice_in_an_object_is_refused_naming_the_file_and_key(
        what: str, read: Callable[[Path], object], error: type[Exception],
        tmp_path: Path) -> None:
    # JSON kept the last silently: an SLO of 9 s read where 900 ms was written first.
    path = tmp_path / f"{what}.json"
    path.write_text(_TWICE[what])
    with pytest.raises(error) as err:
        read(path)
    message = str(err.value)
    assert str(path) in message and "given twice" in message, message
    assert "keep the one you mean" in message and "not valid JSON" not in message
