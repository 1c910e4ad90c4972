"""``slopilot serve`` as a process: the ready line, knobs from the command line, SIGTERM
drains (503 for newcomers while a running stream finishes), bad options exit 2."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.bad_hosts import BAD_HOSTS
from tests.support.waits import HANG_GUARD_S, wait_for


def _serve(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "slopilot.cli", "serve", "--executor", "simulated",
         "--port", "0", "--log-level", "warning", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **(env or {})})


def _ready_urls(proc: subprocess.Popen[str]) -> tuple[str, str | None]:
    """The inference URL and the admin API's, from the ready line."""
    assert proc.stdout is not None
    line = proc.stdout.readline()  # blocks until the ready line (or EOF if it died)
    match = re.search(r"ready at (http://\S+)", line)
    assert match, f"no ready line: {line!r}; stderr: {proc.stderr.read() if proc.stderr else ''}"
    admin = re.search(r"admin API at (http://\S+)", line)
    return match.group(1), admin.group(1) if admin else None


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text("s3cret\n")
    return path


@pytest.fixture
def proc(token_file: Path, tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    knobs = tmp_path / "knobs.json"
    knobs.write_text(json.dumps({"token_budget": 512, "chunk_size": 256}))
    p = _serve("--admin-token-file", str(token_file), "--config", str(knobs),
               "--set", "max_waiting=8", "--served-model-name", "fleet-a",
               "--drain-timeout", f"{HANG_GUARD_S:g}", "--admin-port", "0")
    yield p
    if p.poll() is None:
        p.kill()
    p.wait(HANG_GUARD_S)


def test_serve_drains_on_sigterm(proc: subprocess.Popen[str]) -> None:
    url, admin = _ready_urls(proc)
    auth = {"Authorization": "Bearer s3cret"}
    assert admin is not None and admin != url
    assert httpx.get(admin + "/admin/config").status_code == 401
    assert httpx.get(url + "/admin/config", headers=auth).status_code == 404
    config = httpx.get(admin + "/admin/config", headers=auth).json()
    assert (config["token_budget"], config["chunk_size"], config["max_waiting"]) == (512, 256, 8)
    res = httpx.put(admin + "/admin/config", json={"chunk_size": 128}, headers=auth)
    assert res.status_code == 200
    assert httpx.get(url + "/v1/models").json()["data"][0]["id"] == "fleet-a"

    lines: list[str] = []
    started = threading.Event()

    def stream() -> None:
        body = {"prompt": "a b", "max_tokens": 60, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=HANG_GUARD_S) as r:
            for line in r.iter_lines():
                if line:
                    lines.append(line)
                    started.set()

    reader = threading.Thread(target=stream)
    reader.start()
    assert started.wait(HANG_GUARD_S)
    proc.send_signal(signal.SIGTERM)
    wait_for(lambda: httpx.get(url + "/health").status_code == 503, what="draining")
    late = httpx.post(url + "/v1/completions", json={"prompt": "late", "max_tokens": 1})
    assert late.status_code == 503 and late.json()["error"]["code"] == "draining"
    reader.join(HANG_GUARD_S)
    assert lines[-1] == "data: [DONE]"
    last = json.loads(lines[-2].removeprefix("data: "))
    assert last["choices"][0]["finish_reason"] == "length"
    assert proc.wait(HANG_GUARD_S) == 0


@pytest.mark.parametrize(("args", "words"), [
    (["--set", "token_budget=5"], "token_budget=5 is out of range"),
    (["--set", "nonsense"], "expected knob=value"),
    (["--gpu", "A100"], "--gpu applies to --executor simulated only"),
    (["--scenario", "no-such-scenario"], "no-such-scenario"),
    (["--port", "8123", "--admin-port", "8123"], "port of its own"),
    (["--dtype", "bfloat16"], "--dtype applies to --executor torch only"),
    (["--dtype", "float64"], "invalid choice: 'float64'"),
    (["--decode-graphs", "off"], "--decode-graphs applies to --executor torch only"),
    (["--decode-graphs", "always"], "invalid choice: 'always'"),
    (["--piecewise-graphs", "cuda"], "--piecewise-graphs applies to --executor torch only"),
    (["--max-body-mb", "0"], "--max-body-mb 0: expected MiB above 0"),
    (["--max-body-mb", "nan"], "--max-body-mb nan: expected MiB above 0"),
    (["--max-body-mb", "lots"], "--max-body-mb lots: expected MiB above 0"),
    (["--head-timeout", "0"], "--head-timeout 0: expected seconds above 0"),
    (["--body-idle-timeout", "inf"], "--body-idle-timeout inf: expected seconds above 0"),
    (["--send-timeout", "-1"], "--send-timeout -1: expected a number of seconds, e.g. 60.0, "
                               "or 0 for no send deadline"),
    (["--send-timeout", "inf"], "--send-timeout inf: expected a number of seconds"),
    (["--send-timeout", "soon"], "--send-timeout soon: expected a number of seconds, e.g. 60"),
    (["--keep-alive-timeout", "0"], "--keep-alive-timeout 0: expected seconds above 0"),
    (["--keep-alive-timeout", "nan"], "--keep-alive-timeout nan: expected seconds above 0"),
    (["--max-connections", "0"], "--max-connections 0: expected 1 to 1000000 connections"),
    (["--max-connections", "-3"], "--max-connections -3: expected 1 to 1000000"),
    (["--max-connections", "5000000"], "--max-connections 5000000: expected 1 to 1000000"),
    (["--max-connections", "lots"], "--max-connections 'lots': expected a whole number of "
                                    "connections, e.g. 512"),
    (["--max-connections", "2.5"], "--max-connections '2.5': expected a whole number"),
    (["--port", "-1"], "--port -1: expected a port number, 0 to 65535"),
    (["--admin-port", "70000"], "--admin-port 70000: expected a port number, 0 to 65535"),
    (["--admin-token-file", "/no/such/token"], "--admin-token-file /no/such/token: no such "
                                               "file"),
    # Python's "[Errno 2] No such file or directory: '...'" named the file twice.
    (["--config", "/no/such/knobs.json"], "--config /no/such/knobs.json: no such file"),
    (["--config", "/"], "--config /: is a folder, not a file"),
    (["--clients", "/no/such/clients.json"], "--clients /no/such/clients.json: no such "
                                             "file"),
])
def test_bad_options_exit_2(args: list[str], words: str,
                            capsys: pytest.CaptureFixture[str]) -> None:
    # In this process: ``python -m slopilot.cli`` exits with what ``main`` returns (or
    # argparse's SystemExit), as the two cases below show a process doing; thirty Python
    # start-ups, one a case, were 15 s of CPU.
    from slopilot.cli import main

    executor = ["--executor", "torch"] if "--gpu" in args else []
    try:
        code = main(["serve", "--port", "0", *(executor or ["--executor", "simulated"]),
                     *args])
    except SystemExit as exc:  # argparse's own refusals
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2
    assert words in err
    assert "Errno" not in err, err


@pytest.mark.parametrize(("args", "words"), [
    (["--device", "tpu"], "--device 'tpu': use cpu, cuda or cuda:N (or cpu:N)"),
    (["--device", "cuda:x"], "--device 'cuda:x': use cpu, cuda or cuda:N (or cpu:N)"),
    (["--device", "cuda:"], "--device 'cuda:': use cpu, cuda or cuda:N (or cpu:N)"),
    (["--device", "cpu:"], "--device 'cpu:': use cpu, cuda or cuda:N (or cpu:N)"),
    (["--scenario", "tiny-cpu"], "--scenario applies to --executor simulated only"),
    (["--tp", "2"], "--tp applies to --executor simulated only"),
])
def test_bad_torch_options_exit_2_before_a_model_loads(
        args: list[str], words: str, capsys: pytest.CaptureFixture[str]) -> None:
    """--device is checked as calibrate checks it (a RuntimeError traceback from torch was
    all serve said); --scenario was dropped without a word where --gpu was refused."""
    from slopilot.cli import main

    # An address no machine here has: a flag let through fails at the bind, not serves.
    code = main(["serve", "--host", "192.0.2.1", "--port", "0", "--executor", "torch",
                 *args])
    err = capsys.readouterr().err
    assert code == 2
    assert f"slopilot serve: {words}" in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize(("host", "words"), BAD_HOSTS)
def test_a_host_that_cannot_be_listened_on_is_named_with_its_flag(
        host: str, words: str, capsys: pytest.CaptureFixture[str]) -> None:
    """It was blamed on the port: "--port 0: ... stop what holds it or pick another
    port"."""
    from slopilot.cli import main

    code = main(["serve", "--executor", "simulated", "--port", "0", "--host", host])
    err = capsys.readouterr().err
    assert code == 2
    assert words in err, err
    assert "--port" not in err and "Errno" not in err, err


@pytest.mark.parametrize(("args", "words"), [
    (["--set", "token_budget=5"], "token_budget=5 is out of range"),  # serve's own check
    (["--dtype", "float64"], "invalid choice: 'float64'"),           # argparse's
])
def test_a_process_given_bad_options_exits_2(args: list[str], words: str) -> None:
    p = subprocess.run([sys.executable, "-m", "slopilot.cli", "serve", "--port", "0",
                        "--executor", "simulated", *args],
                       capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert p.returncode == 2
    assert words in p.stderr
    assert "Errno" not in p.stderr, p.stderr


@pytest.mark.parametrize(("args", "words"), [
    (["--gpu", "A1000"], "--gpu A1000: unknown GPU 'A1000'"),
    (["--sim-model", "llama-3-9b"], "--sim-model llama-3-9b: unknown model 'llama-3-9b'"),
])
def test_an_unknown_simulated_profile_is_named_with_its_flag(args: list[str],
                                                             words: str) -> None:
    p = subprocess.run([sys.executable, "-m", "slopilot.cli", "serve", "--port", "0",
                        "--executor", "simulated", *args],
                       capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert p.returncode == 2
    assert words in p.stderr, p.stderr


@pytest.mark.parametrize("flag", ["--port", "--admin-port"])
def test_a_port_already_taken_is_named_with_its_flag(flag: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        args = ["--port", port] if flag == "--port" else ["--port", "0", "--admin-port", port]
        p = subprocess.run([sys.executable, "-m", "slopilot.cli", "serve", "--executor",
                            "simulated", *args], capture_output=True, text=True,
                           timeout=HANG_GUARD_S)
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr
    assert f"{flag} {port}: cannot listen on 127.0.0.1:{port}: Address already in use" \
        in p.stderr, p.stderr


def test_the_body_cap_is_set_from_the_command_line() -> None:
    p = _serve("--max-body-mb", "0.001")  # 1048 bytes
    try:
        url, _ = _ready_urls(p)
        big = httpx.post(f"{url}/v1/completions", timeout=HANG_GUARD_S,
                         json={"prompt": "x" * 2000, "max_tokens": 1})
        assert big.status_code == 413, big.text
        assert "at most 1048 bytes" in big.text
        small = httpx.post(f"{url}/v1/completions", timeout=HANG_GUARD_S,
                           json={"prompt": "hi", "max_tokens": 1})
        assert small.status_code == 200, small.text
    finally:
        p.kill()
        p.wait(HANG_GUARD_S)


def test_the_head_deadline_is_set_from_the_command_line() -> None:
    p = _serve("--head-timeout", "0.5")
    try:
        url = httpx.URL(_ready_urls(p)[0])
        with socket.create_connection((url.host, url.port)) as sock:
            sock.settimeout(HANG_GUARD_S)
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n")  # and no more
            answer = b""
            while got := sock.recv(65536):
                answer += got
        assert answer.startswith(b"HTTP/1.1 408 "), answer
    finally:
        p.kill()
        p.wait(HANG_GUARD_S)


def test_serve_enforces_the_grants_in_its_clients_file(tmp_path: Path) -> None:
    import hashlib

    key = "sk-reports-0c1d2e3f4a5b6c7d8e9f"
    grants = {"keys": [{"name": "reports", "maxClass": "p1",
                        "sha256": hashlib.sha256(key.encode()).hexdigest()}]}
    (tmp_path / "clients.json").write_text(json.dumps(grants))
    p = _serve("--clients", str(tmp_path / "clients.json"))
    try:
        url, _ = _ready_urls(p)
        ask = {"prompt": "hi", "max_tokens": 1, "priority": "p1"}
        for headers, status in (({}, 401), ({"Authorization": f"Bearer {key}"}, 200)):
            res = httpx.post(f"{url}/v1/completions", json=ask, headers=headers,
                             timeout=HANG_GUARD_S)
            assert res.status_code == status, res.text
        res = httpx.post(f"{url}/v1/completions", json={**ask, "priority": "p0"},
                         headers={"Authorization": f"Bearer {key}"}, timeout=HANG_GUARD_S)
        assert res.status_code == 403, res.text
    finally:
        p.kill()
        p.wait(HANG_GUARD_S)


def test_an_unusable_clients_file_names_the_flag_the_file_and_the_field(
        tmp_path: Path) -> None:
    from slopilot.engine.server.commands import load_clients_file

    path = tmp_path / "clients.json"
    path.write_text(json.dumps({"keys": [{"name": "a", "sha256": "0" * 64,
                                          "maxClass": "p7"}]}))
    with pytest.raises(ValueError, match=r"^--clients .*clients\.json: "
                       r"clients\.keys\[0\]\.maxClass: .*p7"):
        load_clients_file(path)
    path.write_text("{")
    with pytest.raises(ValueError, match=r"^--clients .*clients\.json: not valid JSON"):
        load_clients_file(path)
    path.write_text(json.dumps({"anonymous": {"maxClass": "p2"}}))
    assert load_clients_file(path).current().anonymous is not None


def test_serve_freezes_its_start_up_heap_before_it_serves() -> None:
    """A full collection walks every long-lived object (the model, the tokenizer, the
    web stack): 166 ms on the engine thread, a TBT spike far above any SLO. The
    process freezes what start-up left, so collections while serving skip it."""
    p = _serve("--log-level", "info")
    try:
        url, _ = _ready_urls(p)
        for _ in range(20):  # enough allocation for young collections
            httpx.post(url + "/v1/completions", json={"prompt": "a b", "max_tokens": 4},
                       timeout=HANG_GUARD_S)
        scraped = httpx.get(url + "/metrics", timeout=HANG_GUARD_S).text
    finally:
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=HANG_GUARD_S)
    froze = re.search(r"froze the start-up heap: (\d+) objects", err)
    assert froze, err[-2000:]
    assert int(froze.group(1)) > 10_000  # the imports alone: what collections now skip
    # What collections cost while it serves (every thread waits them out).
    young = re.search(r'slopilot_gc_pause_seconds_count\{generation="0"\} (\S+)', scraped)
    assert young and float(young.group(1)) >= 1, scraped[-1500:]
    # When the process started, as vLLM's default registry says it too: a window whose
    # replica restarted in place reads it moved, where its counters showed no reset.
    started = re.search(r"^process_start_time_seconds (\S+)$", scraped, re.MULTILINE)
    assert started and abs(float(started.group(1)) - time.time()) < 3600, scraped[-1500:]


def test_the_deadlines_are_set_from_the_command_line_each_over_its_default() -> None:
    import argparse

    from slopilot.engine.deadline_flags import deadlines_from_flags
    from slopilot.engine.http_deadlines import Deadlines
    from slopilot.engine.server.commands import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["serve", "--send-timeout", "0", "--head-timeout", "5",
                              "--keep-alive-timeout", "75"])
    # 0: no send deadline, as the flag's help says; the one not given keeps its default.
    assert deadlines_from_flags(args) == Deadlines(head_s=5.0, send_s=0.0, keep_alive_s=75.0)
    assert deadlines_from_flags(parser.parse_args(["serve"])) == Deadlines()


def test_a_connection_cap_past_the_descriptors_is_refused_with_the_most_it_can_hold(
        ) -> None:
    """Under ``ulimit -n 256`` (soft and hard: the server raises a soft limit to the hard
    one first) a cap of 1000 would run out of descriptors long before it refused anyone:
    named, with what the process can hold and how to get more."""
    import resource

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    p = subprocess.run([sys.executable, "-m", "slopilot.cli", "serve", "--executor",
                        "simulated", "--port", "0", "--max-connections", "1000"],
                       capture_output=True, text=True, timeout=HANG_GUARD_S,
                       preexec_fn=low_limit)
    assert p.returncode == 2, p.stderr
    assert "--max-connections 1000: this process may open 256 descriptors (ulimit -n)" \
        in p.stderr, p.stderr
    assert "give at most 192, or raise ulimit -n" in p.stderr
    assert "Traceback" not in p.stderr


def test_the_connection_cap_is_set_from_the_command_line() -> None:
    """``--max-connections 1``: one client keeping its connection holds the only slot; a
    second is refused 503 at once while the probe's /health still answers."""
    p = _serve("--max-connections", "1", "--keep-alive-timeout", "3600")
    try:
        url, _ = _ready_urls(p)
        with httpx.Client(base_url=url, timeout=HANG_GUARD_S) as keeper:
            assert keeper.get("/v1/models").status_code == 200  # and keeps its connection
            refused = httpx.get(f"{url}/v1/models", timeout=HANG_GUARD_S)
            assert refused.status_code == 503, refused.text
            assert refused.headers["retry-after"] == "1"
            assert refused.json()["error"]["code"] == "too_many_connections"
            assert httpx.get(f"{url}/health", timeout=HANG_GUARD_S).status_code == 200
            assert keeper.get("/v1/models").status_code == 200  # its slot is its own
    finally:
        p.kill()
        p.wait(HANG_GUARD_S)


def test_the_help_says_where_serve_listens_by_default(
        capsys: pytest.CaptureFixture[str]) -> None:
    """127.0.0.1, where ``slopilot meter`` listens on 0.0.0.0: each help says its own."""
    from slopilot.cli import main

    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "default 127.0.0.1: this machine only; 0.0.0.0 for every interface" in out


def test_cpu_0_is_a_device_as_torch_takes_it() -> None:
    """serve took --device cpu:0 (torch's name for the CPU) before the shared check
    refused it."""
    from slopilot.engine.device_flag import check_device

    check_device("cpu:0")
    check_device("cpu")
