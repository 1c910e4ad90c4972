"""``slopilot serve``'s flags, refused before anything is served: each refusal names the
flag, the value and the fix; none is a traceback, none is silently dropped. In process,
``serve_forever`` replaced: nothing here listens."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from slopilot.cli import main
from slopilot.engine.config import EngineConfig
from slopilot.engine.server.backends import Backend, BackendError, build_simulated


@pytest.fixture(autouse=True)
def served(monkeypatch: pytest.MonkeyPatch) -> list[Backend]:
    """The backends ``serve`` would have served (none, where it refuses)."""
    import slopilot.engine.server.uvicorn_runner as runner

    backends: list[Backend] = []

    def serve_forever(backend: Backend, **_: object) -> int:
        backends.append(backend)
        backend.close()
        return 0
    monkeypatch.setattr(runner, "serve_forever", serve_forever)
    return backends


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's refusals
        code = exc.code  # type: ignore[assignment]
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    return " ".join(err.split())


SIMULATED = ["serve", "--executor", "simulated", "--port", "0"]


@pytest.mark.parametrize("value", ["nan", "inf", "1e400", "-1", "soon"])
def test_a_drain_timeout_that_is_no_wait_is_refused(
        value: str, capsys: pytest.CaptureFixture[str], served: list[Backend]) -> None:
    err = _refused([*SIMULATED, "--drain-timeout", value], capsys)
    assert f"--drain-timeout {value}: expected seconds, 0 or more" in err
    assert served == []


def test_a_drain_timeout_of_zero_is_no_wait(served: list[Backend]) -> None:
    assert main([*SIMULATED, "--drain-timeout", "0"]) == 0
    assert len(served) == 1


@pytest.mark.parametrize("value", ["0", "-1", "3"])
def test_a_tp_degree_that_is_none_is_refused(
        value: str, capsys: pytest.CaptureFixture[str], served: list[Backend]) -> None:
    err = _refused([*SIMULATED, "--tp", value], capsys)
    assert f"--tp {value}: tensor parallelism must be one of 1, 2, 4, 8" in err
    assert served == []


@pytest.mark.parametrize("value", ["0", "-1"])
def test_a_kv_cache_of_no_blocks_is_refused(
        value: str, capsys: pytest.CaptureFixture[str], served: list[Backend]) -> None:
    err = _refused([*SIMULATED, "--num-gpu-blocks", value], capsys)
    assert f"--num-gpu-blocks {value}: expected at least 1 KV block" in err
    assert served == []


def test_zero_is_a_value_not_a_missing_one() -> None:
    """Python's ``or`` took 0 for "not given": the scenario's degree and a cache sized from
    memory were served instead, without a word."""
    with pytest.raises(BackendError, match="--tp 0"):
        build_simulated(EngineConfig(), tp=0, realtime=False)
    with pytest.raises(BackendError, match="--num-gpu-blocks 0"):
        build_simulated(EngineConfig(), num_gpu_blocks=0, realtime=False)


@pytest.mark.parametrize(("flags", "words"), [
    (["--model", "smollm2-135m"], "--model smollm2-135m: the simulated executor serves the "
                                  "scenario's cost model"),
    (["--model", "tiny-random"], "--model tiny-random: the simulated executor serves"),
    (["--device", "cuda"], "--device applies to --executor torch only"),
    (["--device", "cpu"], "--device applies to --executor torch only"),
    (["--cpu-bind", "auto"], "--cpu-bind applies to --executor torch only"),
    (["--cpu-kernels", "native"], "--cpu-kernels applies to --executor torch only"),
])
def test_a_torch_flag_given_to_the_simulated_executor_is_refused(
        flags: list[str], words: str, capsys: pytest.CaptureFixture[str],
        served: list[Backend]) -> None:
    err = _refused([*SIMULATED, *flags], capsys)
    assert words in err
    assert served == []


def test_the_torch_executor_still_serves_tiny_random_by_default(
        tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        served: list[Backend]) -> None:
    monkeypatch.setenv("SLOPILOT_CACHE_DIR", str(tmp_path))
    _cached_copy(tiny, tmp_path)
    assert main(["serve", "--port", "0", "--num-gpu-blocks", "8"]) == 0
    (backend,) = served
    assert backend.served_model_name == "tiny-random"


def test_a_kv_cache_past_the_hosts_memory_is_refused_before_it_is_allocated(
        tiny: Path, capsys: pytest.CaptureFixture[str], served: list[Backend]) -> None:
    err = _refused(["serve", "--model", str(tiny), "--port", "0", "--num-gpu-blocks",
                    "99999999999"], capsys)
    assert "--num-gpu-blocks 99999999999:" in err and "host memory available" in err
    assert "give at most" in err and "GiB" in err
    assert served == []


def _cached_copy(tiny: Path, root: Path) -> Path:
    """``root/models/tiny-random``: the model as ``slopilot models fetch`` caches it."""
    dest = root / "models" / "tiny-random"
    if not dest.exists():
        shutil.copytree(tiny, dest)
    return dest


def test_a_cached_model_cut_short_is_named_with_how_to_rebuild_it(
        tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], served: list[Backend]) -> None:
    weights = _cached_copy(tiny, tmp_path) / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:5])
    monkeypatch.setenv("SLOPILOT_CACHE_DIR", str(tmp_path))
    err = _refused(["serve", "--model", "tiny-random", "--port", "0"], capsys)
    assert f"{weights} is not a readable safetensors file" in err
    assert "`slopilot models fetch tiny-random --force`" in err
    assert served == []
