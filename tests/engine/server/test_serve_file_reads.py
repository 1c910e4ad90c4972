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
