"""``slopilot meter``'s command line: what a user gets wrong is named, with the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slopilot.cli import main


@pytest.mark.parametrize("upstream", ["127.0.0.1:8001", "ftp://h:1", "http://h:1/base",
                                      "http://h:1/?x=1", "http://[::1"])
def test_an_upstream_that_is_not_an_engines_root_is_refused(
        tmp_path: Path, upstream: str, capsys: pytest.CaptureFixture[str]) -> None:
    slo = tmp_path / "slo.json"
    slo.write_text(json.dumps({"profile": "standard"}))
    assert main(["meter", "--upstream", upstream, "--slo-file", str(slo)]) == 2
    err = capsys.readouterr().err
    assert repr(upstream) in err and "e.g. http://127.0.0.1:8001" in err


@pytest.mark.parametrize(("text", "why"), [(None, "cannot read it"), ("{", "not valid JSON"),
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
          "--keep-alive-timeout", "75", "--send-timeout", "0"])
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
