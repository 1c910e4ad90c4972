"""``slopilot meter``'s command line: what a user gets wrong is named, with the fix."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from slopilot.cli import main
from tests.support.bad_hosts import BAD_HOSTS

LOOPBACK = ["--host", "127.0.0.1", "--port", "0"]
"""Where a meter whose ``uvicorn.Server.run`` a test replaced listens: it binds before
it runs, and the default, 0.0.0.0:8000, may be another's."""


@pytest.mark.parametrize("upstream", ["127.0.0.1:8001", "ftp://h:1", "http://h:1/base",
                                      "http://h:1/?x=1", "http://[::1"])
def test_an_upstream_that_is_not_an_engines_root_is_refused(
        tmp_path: Path, upstream: str, capsys: pytest.CaptureFixture[str]) -> None:
    slo = tmp_path / "slo.json"
    slo.write_text(json.dumps({"profile": "standard"}))
    assert main(["meter", "--upstream", upstream, "--slo-file", str(slo)]) == 2
    err = capsys.readouterr().err
    assert repr(upstream) in err and "e.g. http://127.0.0.1:8001" in err


@pytest.mark.parametrize(("text", "why"), [(None, "no such file"), ("{", "not valid JSON"),
                                           ('{"profile": "nope"}', "profile")])
def test_an_slo_file_that_cannot_be_judged_by_is_refused(
        tmp_path: Path, text: str | None, why: str, capsys: pytest.CaptureFixture[str]) -> None:
    slo = tmp_path / "slo.json"
    if text is not None:
        slo.write_text(text)
    assert main(["meter", "--upstream", "http://127.0.0.1:8001", "--slo-file", str(slo)]) == 2
    err = capsys.readouterr().err
    assert "--slo-file" in err and why in err


def test_a_class_that_is_not_one_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["meter", "--upstream", "http://127.0.0.1:8001", "--slo-file", "x",
              "--priority-class", "p7"])
    assert exc.value.code == 2


def test_the_deadlines_are_the_servers_flags(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """In front of vLLM the meter is the server its clients (and their proxies) keep
    connections to: its keep-alive must be set above theirs, as ``slopilot serve``'s."""
    import uvicorn

    from slopilot.engine.http_deadlines import Deadlines

    served: list[Deadlines] = []
    monkeypatch.setattr(uvicorn.Server, "run",
                        lambda self, sockets=None: served.append(self.config.http.deadlines))
    slo = tmp_path / "slo.json"
    slo.write_text(json.dumps({"profile": "standard"}))
    main(["meter", "--upstream", "http://127.0.0.1:8001", "--slo-file", str(slo),
          *LOOPBACK, "--keep-alive-timeout", "75", "--send-timeout", "0"])
    assert served == [Deadlines(keep_alive_s=75.0, send_s=0.0)]


def test_a_deadline_out_of_bounds_is_refused(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    slo = tmp_path / "slo.json"
    slo.write_text(json.dumps({"profile": "standard"}))
    base = ["meter", "--upstream", "http://127.0.0.1:8001", "--slo-file", str(slo)]
    with pytest.raises(SystemExit) as exc:  # argparse's: not seconds above 0
        main([*base, "--keep-alive-timeout", "0"])
    assert exc.value.code == 2
    assert "--keep-alive-timeout 0: expected seconds above 0" in capsys.readouterr().err
    assert main([*base, "--send-timeout", "-1"]) == 2  # Deadlines' own bound
    assert "slopilot meter: --send-timeout -1: expected a number of seconds, e.g. 60.0" \
        in capsys.readouterr().err


def test_a_log_level_that_is_not_one_is_refused_with_the_choices(
        capsys: pytest.CaptureFixture[str]) -> None:
    # It reached logging.basicConfig, whose ValueError was a traceback.
    with pytest.raises(SystemExit) as exc:
        main(["meter", "--upstream", "http://127.0.0.1:8001", "--slo-file", "x",
              "--log-level", "loud"])
    assert exc.value.code == 2
    assert "invalid choice: 'loud'" in capsys.readouterr().err


def _served_meter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *flags: str) -> object:
    """The app ``slopilot meter`` would serve with ``flags``, behind its connection cap."""
    import uvicorn

    from slopilot.engine.connection_cap import CapGate

    served: list[object] = []

    def run(self: uvicorn.Server, sockets: object = None) -> None:
        assert isinstance(self.config.app, CapGate)
        served.append(self.config.app.app)

    monkeypatch.setattr(uvicorn.Server, "run", run)
    slo = tmp_path / "slo.json"
    slo.write_text(json.dumps({"profile": "standard"}))
    main(["meter", "--upstream", "http://127.0.0.1:8001", "--slo-file", str(slo), *LOOPBACK,
          *flags])
    return served[0]


def test_the_body_limits_are_flags_sized_within_the_meters_memory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One body at most ``--max-body-mb`` (16 MiB by default, as ``slopilot serve``'s), all
    bodies held at once at most ``--body-budget-mb`` (64): within the 256 MiB the operator
    gives the meter, with the interpreter's 65 and the streams'."""
    from slopilot.engine.meter.body_budget import BODY_BUDGET_MIB, MAX_BODY_MIB
    from slopilot.engine.meter.proxy import Meter

    meter = _served_meter(tmp_path, monkeypatch)
    assert isinstance(meter, Meter)
    assert (meter.max_body_bytes, meter.budget.limit) == (MAX_BODY_MIB << 20,
                                                          BODY_BUDGET_MIB << 20)
    meter = _served_meter(tmp_path, monkeypatch, "--max-body-mb", "0.5",
                          "--body-budget-mb", "2")
    assert isinstance(meter, Meter)
    assert (meter.max_body_bytes, meter.budget.limit) == (1 << 19, 2 << 20)


@pytest.mark.parametrize(("flags", "why"), [
    (["--max-body-mb", "0"], "--max-body-mb 0: expected MiB above 0, e.g. 16"),
    (["--body-budget-mb", "lots"], "--body-budget-mb lots: expected MiB above 0, e.g. 64"),
])
def test_a_body_limit_that_is_no_size_is_refused(
        tmp_path: Path, flags: list[str], why: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["meter", "--upstream", "http://127.0.0.1:8001", "--slo-file", "x", *flags])
    assert exc.value.code == 2
    assert why in capsys.readouterr().err


def test_a_budget_below_one_body_is_refused(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """A body of the cap could never be held: it would wait for ever."""
    slo = tmp_path / "slo.json"
    slo.write_text(json.dumps({"profile": "standard"}))
    assert main(["meter", "--upstream", "http://127.0.0.1:8001", "--slo-file", str(slo),
                 "--max-body-mb", "32", "--body-budget-mb", "16"]) == 2
    assert "--body-budget-mb 16: below --max-body-mb 32; set it to 32 or more" \
        in capsys.readouterr().err


@pytest.mark.parametrize("port", ["99999", "-1", "http"])
def test_a_port_that_is_none_is_refused_before_anything_listens(
        tmp_path: Path, port: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """99999 was taken modulo 65536 (the log said :99999, the socket was :34463); -1 was
    the resolver's "Servname not supported", naming no flag."""
    import uvicorn

    served: list[int] = []
    monkeypatch.setattr(uvicorn.Server, "run",
                        lambda self, sockets=None: served.append(self.config.port))
    slo = tmp_path / "slo.json"
    slo.write_text(json.dumps({"profile": "standard"}))
    with pytest.raises(SystemExit) as exc:
        main(["meter", "--upstream", "http://127.0.0.1:8001", "--slo-file", str(slo),
              "--port", port])
    assert exc.value.code == 2
    assert f"--port {port}: expected a port number, 0 to 65535" in capsys.readouterr().err
    assert served == []


@pytest.mark.parametrize(("value", "words"), [
    ("0", "--max-connections 0: expected 1 to 1000000 connections"),
    ("-1", "--max-connections -1: expected 1 to 1000000"),
    ("many", "--max-connections 'many': expected a whole number of connections"),
])
def test_a_connection_cap_that_is_not_one_is_refused(
        value: str, words: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["meter", "--upstream", "http://127.0.0.1:8001", "--slo-file", "x",
              "--max-connections", value])
    assert exc.value.code == 2
    assert words in capsys.readouterr().err


def test_the_connection_cap_counts_two_descriptors_a_connection(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Each client connection of the meter holds one to vLLM too: under ``ulimit -n``
    1024 its default is 256, and a cap above (1024 - 64) / 2 is refused, named."""
    import uvicorn

    from slopilot.engine import connection_cap

    monkeypatch.setattr(connection_cap, "open_files_limit", lambda: 1024)
    served: list[int] = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets=None: served.append(
        self.config.app.cap.limit))
    slo = tmp_path / "slo.json"
    slo.write_text(json.dumps({"profile": "standard"}))
    base = ["meter", "--upstream", "http://127.0.0.1:8001", "--slo-file", str(slo), *LOOPBACK]
    main(base)
    main([*base, "--max-connections", "480"])
    assert served == [256, 480]
    assert main([*base, "--max-connections", "481"]) == 2
    err = capsys.readouterr().err
    assert "slopilot meter: --max-connections 481: this process may open 1024 descriptors " \
        "(ulimit -n), 2 descriptors a connection" in err
    assert "give at most 480" in err


def _slo_file(tmp_path: Path) -> Path:
    slo = tmp_path / "slo.json"
    slo.write_text(json.dumps({"profile": "standard"}))
    return slo


def _exit_code(argv: list[str]) -> int | str | None:
    try:
        return main(argv)
    except SystemExit as exc:  # uvicorn's own exit on a failed bind
        return exc.code


def test_a_port_already_taken_is_named_with_its_flag(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """uvicorn's "ERROR: [Errno 98] address already in use" among its INFO lines, and
    exit 3, was all the meter said; serve named the flag and the fix."""
    with socket.socket() as taken:  # listened on: no bind, SO_REUSEADDR or not, takes it
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = _exit_code(["meter", "--upstream", "http://127.0.0.1:8001", "--slo-file",
                           str(_slo_file(tmp_path)), "--host", "127.0.0.1", "--port",
                           str(port)])
    err = capsys.readouterr().err
    assert code == 2
    assert (f"slopilot meter: --port {port}: cannot listen on 127.0.0.1:{port}: Address "
            "already in use; stop what holds it or pick another port") in err, err
    assert "Errno" not in err


@pytest.mark.parametrize(("host", "words"), BAD_HOSTS)
def test_a_host_that_cannot_be_listened_on_is_named_with_its_flag(
        tmp_path: Path, host: str, words: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = _exit_code(["meter", "--upstream", "http://127.0.0.1:8001", "--slo-file",
                       str(_slo_file(tmp_path)), "--host", host, "--port", "0"])
    err = capsys.readouterr().err
    assert code == 2
    assert f"slopilot meter: {words}" in err, err
    assert "--port" not in err and "Errno" not in err, err


def test_the_help_says_where_the_meter_listens_by_default_and_why(
        capsys: pytest.CaptureFixture[str]) -> None:
    """0.0.0.0, where ``slopilot serve`` listens on 127.0.0.1: in its pod the meter is
    what vLLM's clients reach, on the pod's address (the operator passes no --host)."""
    with pytest.raises(SystemExit):
        main(["meter", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--host HOST" in out
    assert "default 0.0.0.0: every interface" in out
    assert "--host 127.0.0.1 for this machine only" in out
