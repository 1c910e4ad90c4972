"""`slopilot calibrate` on the real torch executor (tiny-random, a tiny grid): the
structure of what it writes and prints, and its refusals. No timing is asserted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from slopilot.cli import main
from slopilot.engine.sim.profile_file import load_profile

TINY_GRID = ["--quick", "--token-budget", "128", "--max-num-seqs", "4", "--max-context",
             "256", "--repeats", "1", "--tolerance", "10", "--threads", "1",
             "--kv-cache-gb", "0.05"]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_quick_calibration_writes_a_profile_and_prints_the_table(
        tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sub" / "tiny.yaml"
    assert main(["calibrate", "--model", str(tiny), "--out", str(out), *TINY_GRID]) == 0
    printed = capsys.readouterr().out
    assert "Fit error per iteration" in printed and "engine loop" in printed
    assert f"wrote {out}" in printed.replace("\n", "")
    p = load_profile(out)
    assert (p.device.type, p.device.threads, p.dtype) == ("cpu", 1, "float32")
    assert p.model.name == "tiny-random" and p.model.num_layers == 2
    assert p.kv_cache_bytes == p.kv_cache_bytes // (16 * p.model.kv_bytes_per_token) * (
        16 * p.model.kv_bytes_per_token) > 0
    assert p.fit is not None and set(p.fit.classes) == {
        "prefill", "multi", "decode", "ragged", "mixed", "large", "large mixed", "multi mixed",
        "swap"}
    assert p.device.cache_bytes is None or p.device.cache_bytes > 0
    assert p.fit.max_context == 256 and p.fit.repeats == 1 and p.fit.host_steps > 0
    assert "torch" in p.versions and p.executor_code and p.created
    # What `slopilot serve` runs by default: the fused kernels where they build.
    from slopilot.engine.executors.native_kernels import choose_kernels

    auto = choose_kernels("auto", torch.device("cpu"), torch.float32)
    assert p.device.kernels == ("native" if auto.native else "torch")
    assert f"kernels {p.device.kernels}" in " ".join(printed.split())
    assert all(v >= 0 for v in p.executor.values()) and p.executor["iteration"] > 0


def test_json_output(tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "tiny.yaml"
    assert main(["calibrate", "--model", str(tiny), "--out", str(out), "--json",
                 "--no-host", "--cpu-kernels", "torch", *TINY_GRID]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["profile"] == str(out) and doc["host"] == {}
    assert doc["kernels"] == "torch" and load_profile(out).device.kernels == "torch"
    assert set(doc["classes"]) >= {"decode", "prefill"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_a_device_that_is_not_there(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "p.yaml"
    assert main(["calibrate", "--model", "tiny-random", "--device", "cuda",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--device cuda: torch" in err and "sees no CUDA device" in err
    assert "--device cpu" in err and not out.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize("flag", ["--decode-graphs", "--piecewise-graphs"])
def test_cuda_graphs_without_a_cuda_device(tiny: Path, tmp_path: Path, flag: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "p.yaml"
    assert main(["calibrate", "--model", str(tiny), flag, "cuda",
                 "--out", str(out), *TINY_GRID]) == 2
    err = " ".join(capsys.readouterr().err.split())
    field = flag.removeprefix("--").replace("-", "_")
    assert f"{field}='cuda' on device 'cpu'" in err and "use 'auto'" in err
    assert not out.exists()


@pytest.mark.parametrize(("args", "message"), [
    (["--device", "tpu"], "--device 'tpu': use cpu, cuda or cuda:N (or cpu:N)"),
    (["--threads", "0"], "--threads 0: expected at least 1"),
    (["--token-budget", "64"], "--token-budget 64: expected 128 to 16384"),
    (["--max-context", "100000"], "--max-context 100000 exceeds"),
    (["--repeats", "0"], "--repeats 0: expected 1 to 100"),
    (["--kv-cache-gb", "nan"], "--kv-cache-gb nan: expected gigabytes > 0"),
    (["--kv-cache-gb", "inf"], "--kv-cache-gb inf: expected gigabytes > 0"),
    (["--kv-cache-gb", "-1"], "--kv-cache-gb -1.0: expected gigabytes > 0"),
    # Refused before the allocation, which failed as a torch RuntimeError traceback.
    (["--kv-cache-gb", "1000000"], "--kv-cache-gb 1000000.0:"),
    (["--kv-cache-gb", "1000000"], "host memory available"),
])
def test_bad_options(tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                     args: list[str], message: str) -> None:
    out = tmp_path / "p.yaml"
    assert main(["calibrate", "--model", str(tiny), "--out", str(out), *args]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_a_cached_model_cut_short_is_named_with_how_to_rebuild_it(
        tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import shutil

    cached = tmp_path / "models" / "tiny-random"
    shutil.copytree(tiny, cached)
    weights = cached / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:5])
    monkeypatch.setenv("SLOPILOT_CACHE_DIR", str(tmp_path))
    out = tmp_path / "p.yaml"
    assert main(["calibrate", "--model", "tiny-random", "--out", str(out), *TINY_GRID]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"{weights} is not a readable safetensors file" in err
    assert "`slopilot models fetch tiny-random --force`" in err
    assert not out.exists()


def test_out_must_be_a_writable_file(tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", "--model", "tiny-random", "--out", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err


def test_an_unknown_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", "--model", "gpt-9", "--out", str(tmp_path / "p.yaml")]) == 2
    assert "neither a checkpoint directory nor a registered model" in capsys.readouterr().err


def test_a_fit_outside_the_tolerance_writes_nothing(
        tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "p.yaml"
    # Real timings never fit exactly: a tolerance of 1e-6 always refuses.
    args = [a if a != "10" else "0.000001" for a in TINY_GRID]
    assert main(["calibrate", "--model", str(tiny), "--out", str(out), *args]) == 2
    err = capsys.readouterr().err
    assert "above --tolerance 1e-06" in err and "worst shapes:" in err
    assert "Nothing was written" in err and not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == []


def _never_time(monkeypatch: pytest.MonkeyPatch) -> None:
    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("timing started before the output paths were checked")

    monkeypatch.setattr("slopilot.engine.calibrate.torch_target.torch_target", never)


def test_the_samples_and_the_profile_in_one_file_are_refused_before_timing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # It printed "raw timings: same.yaml (refit with --refit same.yaml)" and then wrote
    # the profile over them.
    _never_time(monkeypatch)
    same = tmp_path / "same.yaml"
    assert main(["calibrate", "--model", "tiny-random", "--out", str(same),
                 "--samples-out", str(tmp_path / "." / "same.yaml")]) == 2
    err = capsys.readouterr().err
    assert "--samples-out" in err and f"--out {same}" in err and "same file" in err, err
    assert "own path" in err and not same.exists()


def test_a_profile_over_the_checkpoints_own_files_is_refused(
        tiny: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    _never_time(monkeypatch)
    config = tiny / "config.json"
    before = config.read_bytes()
    assert main(["calibrate", "--model", str(tiny), "--out", str(config)]) == 2
    err = capsys.readouterr().err
    assert f"--out {config} is the same file as --model {tiny} (reads {config})" in err, err
    assert config.read_bytes() == before
