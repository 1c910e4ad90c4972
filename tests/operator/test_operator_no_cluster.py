"""``slopilot operator`` with no cluster to talk to: a kubeconfig missing or broken is
said in one line, naming the file and the fix (it will not fix itself); an API server
that does not answer is waited for, one line a try (it may be starting)."""

from __future__ import annotations

import http.server
import logging
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import urllib3

from slopilot.cli import main
from slopilot.operator import commands

UNREACHABLE = """\
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: abc}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


def _exit_message(argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    message = exited.value.code
    assert isinstance(message, str), message  # a message, which exits 1
    assert "\n" not in message and "Traceback" not in message
    return message


@pytest.mark.parametrize("argv", [["operator", "-A"],
                                  ["operator", "-n", "default", "--standalone"],
                                  ["operator", "uninstall", "-n", "default"]])
def test_no_kubeconfig_is_one_line_naming_it(
        argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        kopf_runs: list[Callable[[threading.Event], None]]) -> None:
    missing = tmp_path / "no-such-kubeconfig"
    monkeypatch.setenv("KUBECONFIG", str(missing))
    message = _exit_message(argv)
    assert f"KUBECONFIG={missing}" in message
    assert "point KUBECONFIG at" in message
    assert kopf_runs == []  # standalone too: kopf's login would retry it for ever


@pytest.mark.parametrize(("text", "why"), [("garbage: [\n", "not valid YAML"),
                                           ("- a\n- b\n", "not a kubeconfig")])
def test_a_broken_kubeconfig_is_one_line_naming_it(
        text: str, why: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        kopf_runs: list[Callable[[threading.Event], None]]) -> None:
    broken = tmp_path / "kubeconfig"
    broken.write_text(text)
    monkeypatch.setenv("KUBECONFIG", str(broken))
    message = _exit_message(["operator", "-n", "default", "--standalone"])
    assert f"KUBECONFIG={broken}" in message and why in message
    assert kopf_runs == []


def test_uninstall_with_no_api_server_answering_says_so_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        kopf_runs: list[Callable[[threading.Event], None]]) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text(UNREACHABLE)
    monkeypatch.setenv("KUBECONFIG", str(config))
    message = _exit_message(["operator", "uninstall", "-n", "default", "--timeout", "0"])
    assert "cannot reach the API server at https://127.0.0.1:1" in message
    assert "Connection refused" in message and "run the command again" in message


def _stopped_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kubeconfig: str) -> None:
    """The command logs in with ``kubeconfig``, and a stop (SIGTERM) is already asked for,
    so a wait for the API server ends after its first try."""
    config = tmp_path / "kubeconfig"
    config.write_text(kubeconfig)
    monkeypatch.setenv("KUBECONFIG", str(config))
    stopped = threading.Event()
    stopped.set()
    monkeypatch.setattr(commands, "_stop_event", lambda: stopped, raising=False)


def test_the_operator_waits_for_an_api_server_that_does_not_answer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        kopf_runs: list[Callable[[threading.Event], None]]) -> None:
    """A stop asked for while it waits (SIGTERM) ends it cleanly, kopf never started."""
    _stopped_at_once(tmp_path, monkeypatch, UNREACHABLE)
    with caplog.at_level(logging.WARNING, logger="slopilot.operator"):
        assert main(["operator", "-A"]) == 0
    mine = [r for r in caplog.records if r.name.startswith("slopilot.operator")]
    assert len(mine) == 1 and mine[0].exc_info is None, caplog.text
    assert "cannot reach the API server at https://127.0.0.1:1" in mine[0].getMessage()
    assert "retrying in" in mine[0].getMessage()
    assert kopf_runs == []


def test_waiting_for_the_api_server_backs_off_then_goes_on() -> None:
    from slopilot.operator.api_reach import MAX_RETRY_S, until_reachable

    tries: list[int] = []
    waits: list[float] = []
    lines: list[str] = []

    def step() -> str:
        tries.append(1)
        if len(tries) < 8:
            raise urllib3.exceptions.MaxRetryError(
                None, "/version",  # type: ignore[arg-type]
                urllib3.exceptions.NewConnectionError(
                    None, "Failed to establish a new connection: [Errno 111] refused"))  # type: ignore[arg-type]
        return "reached"

    def wait(seconds: float) -> bool:
        waits.append(seconds)
        return False  # no stop asked for

    assert until_reachable(step, server="https://k:6443", wait=wait,
                           warn=lines.append) == "reached"
    assert waits == sorted(waits) and waits[-1] == MAX_RETRY_S and len(waits) == 7
    assert all("https://k:6443" in line and "[Errno 111] refused" in line for line in lines)
    assert len(lines) == 7


class _Html503(http.server.BaseHTTPRequestHandler):
    """What a load balancer in front of a starting API server answers: 503, in HTML."""

    def do_GET(self) -> None:
        body = b"<html><body>503 Service Unavailable</body></html>"
        self.send_response(503)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("standalone", [True, False])
def test_an_api_server_answering_html_503_is_waited_for_not_a_traceback(
        standalone: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture,
        kopf_runs: list[Callable[[threading.Event], None]]) -> None:
    """The probe took any answer for a server there, and its body for JSON: an HTML 503
    was a JSONDecodeError traceback. A 5xx is a server not ready yet: waited for."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Html503)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        _stopped_at_once(tmp_path, monkeypatch, UNREACHABLE.replace(
            "https://127.0.0.1:1", f"http://127.0.0.1:{server.server_port}"))
        argv = ["operator", "-n", "default"] + (["--standalone"] if standalone else [])
        with caplog.at_level(logging.WARNING):
            assert main(argv) == 0
    finally:
        server.shutdown()
        server.server_close()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and caplog.records[0].exc_info is None, caplog.text
    assert "is not ready (503" in lines[0] and "retrying in" in lines[0], lines
    assert kopf_runs == []


def test_a_try_that_gets_no_answer_is_one_line_not_urllib3s_three_more(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        kopf_runs: list[Callable[[threading.Event], None]]) -> None:
    """urllib3 logged each of its own retries ("Retrying (Retry(total=2...") before the
    operator's line: four lines a try where the docs say one."""
    _stopped_at_once(tmp_path, monkeypatch, UNREACHABLE)
    with caplog.at_level(logging.WARNING):
        assert main(["operator", "-n", "default", "--standalone"]) == 0
    assert [r.name for r in caplog.records] == ["slopilot.operator.commands"], caplog.text
