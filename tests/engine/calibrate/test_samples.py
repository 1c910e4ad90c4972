"""Raw calibration timings kept in a file and fitted again without re-timing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from slopilot.cli import main
from slopilot.engine.calibrate.design import GridOptions
from slopilot.engine.calibrate.fit import FitError
from slopilot.engine.calibrate.runner import CalibrationOptions, Target, fit_recording, measure
from slopilot.engine.calibrate.samples import SamplesFileError, read_samples, write_samples
from slopilot.engine.sim.profile_file import DeviceInfo, load_profile
from slopilot.engine.sim.profiles import get_model
from tests.engine.calibrate.synthetic import SPILL, TRUE, SyntheticExecutor, SyntheticLoopClock

QUICK = GridOptions(token_budget=256, max_num_seqs=16, max_context=512, quick=True)


def _target(executor: SyntheticExecutor, cache_bytes: int | None = None) -> Target:
    return Target(executor, get_model("tiny-random"),
                  DeviceInfo("cpu", "synthetic", 1, cache_bytes, "torch"), "float32",
                  64 * 1024 ** 2, {"torch": "test"}, SyntheticLoopClock())


def test_a_refit_from_the_file_gives_the_fit_of_the_run(tmp_path: Path) -> None:
    opts = CalibrationOptions(grid=QUICK, repeats=3)
    rec = measure(_target(SyntheticExecutor(noise=0.01, seed=2)), opts)
    direct = fit_recording(rec, opts.tolerance)
    back = read_samples(write_samples(rec, tmp_path / "s.json"))
    assert back.samples == rec.samples and back.grid == rec.grid
    assert back.device == rec.device and back.device.kernels == "torch"
    assert [h.rows for h in back.host_steps] == [h.rows for h in rec.host_steps]
    again = fit_recording(back, opts.tolerance)
    assert again.profile.executor == direct.profile.executor
    assert again.profile.host == direct.profile.host
    assert again.profile.fit == direct.profile.fit


def test_a_refit_recomputes_features_from_the_rows(tmp_path: Path) -> None:
    # Times that obey a spill beyond 4096 padded tokens; the cache that puts the knee
    # there holds 4096 tokens of one layer's K and V.
    model = get_model("tiny-random")
    cache = 4096 * model.kv_bytes_per_token // model.num_layers
    executor = SyntheticExecutor({**TRUE, "decode_spill": SPILL * 10}, knee=4096)
    rec = measure(_target(executor, cache_bytes=cache),
                  CalibrationOptions(grid=QUICK, repeats=1, host=False))
    assert rec.decode_knee == 4096
    fit = fit_recording(read_samples(write_samples(rec, tmp_path / "s.json")), host=False)
    assert fit.profile.executor["decode_spill"] == pytest.approx(SPILL * 10, rel=1e-6)
    assert fit.profile.device.cache_bytes == cache


def test_calibrate_keeps_the_samples_and_refits_them(
        tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.engine.calibrate.test_calibrate_cli import TINY_GRID

    samples, first, second = tmp_path / "s.json", tmp_path / "a.yaml", tmp_path / "b.yaml"
    assert main(["calibrate", "--model", str(tiny), "--out", str(first), "--samples-out",
                 str(samples), *TINY_GRID]) == 0
    doc = json.loads(samples.read_text())
    assert doc["schema"] == "slopilot.dev/calibration-samples/v1"
    assert len(doc["samples"]) == load_profile(first).fit.shapes  # type: ignore[union-attr]
    capsys.readouterr()
    assert main(["calibrate", "--refit", str(samples), "--out", str(second),
                 "--tolerance", "10"]) == 0
    assert f"wrote {second}" in capsys.readouterr().out.replace("\n", "")
    a, b = load_profile(first), load_profile(second)
    assert a.executor == b.executor and a.host == b.host and a.device == b.device


def test_a_refit_can_retake_each_shapes_figure_from_its_rounds(tmp_path: Path) -> None:
    from slopilot.engine.calibrate.runner import with_statistic

    rec = measure(_target(SyntheticExecutor(noise=0.3, seed=4)),
                  CalibrationOptions(grid=QUICK, repeats=5, host=False))
    back = read_samples(write_samples(rec, tmp_path / "s.json"))
    fastest = with_statistic(back, "min")
    assert fastest.statistic == "min"
    assert [s.seconds for s in fastest.samples] == [min(s.times) for s in rec.samples]
    assert fit_recording(fastest, 10, host=False).profile.fit.statistic == "min"  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="--statistic 'mean'"):
        with_statistic(back, "mean")


def test_samples_are_kept_when_the_fit_is_refused(
        tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.engine.calibrate.test_calibrate_cli import TINY_GRID

    samples, out = tmp_path / "s.json", tmp_path / "p.yaml"
    args = [a if a != "10" else "0.000001" for a in TINY_GRID]
    assert main(["calibrate", "--model", str(tiny), "--out", str(out), "--samples-out",
                 str(samples), *args]) == 2
    err = capsys.readouterr().err
    assert "above --tolerance" in err and f"--refit {samples}" in err
    assert not out.exists() and read_samples(samples).samples


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d.update(schema="other"), r"schema: expected .*not a calibration samples"),
    (lambda d: d.pop("samples"), r"samples: missing"),
    (lambda d: d["samples"][0].update(rows=[[0, 5, True]]),
     r"samples\[0\]\.rows: row \[0, 5, True\]: expected \[new_tokens >= 1"),
    (lambda d: d["samples"][1].update(seconds="fast"),
     r"samples\[1\]\.seconds: expected a finite number"),
    (lambda d: d["grid"].update(token_budget=1), r"--token-budget 1: expected 128"),
    (lambda d: d["host_steps"][0].update(swaps=[1]), r"host_steps\[0\]\.swaps"),
    # A step's time holds its executor's: a longer executor made a negative loop time,
    # fitted as a loop that costs nothing, at 84 % error, and written with exit 0.
    (lambda d: d["host_steps"][2].update(executor_s=d["host_steps"][2]["step_s"] * 2),
     r"host_steps\[2\]\.executor_s=[0-9.e-]+ exceeds step_s=[0-9.e-]+: the executor runs "
     r"inside the step; re-record the samples"),
    (lambda d: d["host_steps"][2].update(executor_s=-0.001),
     r"host_steps\[2\]\.executor_s: expected seconds >= 0, got -0\.001"),
    (lambda d: d.update(samples=[]), r"samples: is empty"),
    # Copied into the profile as they are: one the profile refuses failed only when
    # the refitted profile was read back, as a traceback naming "<profile text>".
    (lambda d: d["device"].update(type="tpu"), r"device\.type: expected one of cpu, cuda"),
    (lambda d: d.update(dtype="int8"), r"dtype: expected one of float32, bfloat16, float16"),
    (lambda d: d.update(statistic="mean"), r"statistic: expected one of median, min"),
    (lambda d: d.update(kv_cache_bytes=1e30), r"kv_cache_bytes: expected a whole number "
                                               r"from 0 to 4398046511104"),
    (lambda d: d.update(block_size=5000), r"block_size: expected a whole number from 1 to "
                                          r"1024"),
])
def test_a_bad_samples_file_is_named(tmp_path: Path, change: object, message: str) -> None:
    rec = measure(_target(SyntheticExecutor()), CalibrationOptions(grid=QUICK, repeats=1))
    path = write_samples(rec, tmp_path / "s.json")
    doc = json.loads(path.read_text())
    change(doc)  # type: ignore[operator]
    path.write_text(json.dumps(doc))
    with pytest.raises(SamplesFileError, match=message):
        read_samples(path)


def test_refit_refuses_what_it_cannot_use(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", "--refit", str(tmp_path / "none.json"), "--out",
                 str(tmp_path / "p.yaml")]) == 2
    assert "cannot read calibration samples" in capsys.readouterr().err
    (tmp_path / "x.json").write_text("[1, 2]")
    assert main(["calibrate", "--refit", str(tmp_path / "x.json"), "--out",
                 str(tmp_path / "p.yaml")]) == 2
    assert "the file: expected an object" in capsys.readouterr().err
    assert main(["calibrate", "--refit", str(tmp_path / "x.json"), "--model", "tiny-random",
                 "--out", str(tmp_path / "p.yaml")]) == 2
    assert "takes no --model" in capsys.readouterr().err
    assert main(["calibrate", "--out", str(tmp_path / "p.yaml")]) == 2
    assert "--model is required" in capsys.readouterr().err
    assert not (tmp_path / "p.yaml").exists()


@pytest.mark.parametrize(("text", "why"), [
    ("[" * 100_000, "nested too deep"),
    ('{"schema": ' + "9" * 5000 + "}", "a number too long"),
])
def test_json_the_decoder_cannot_take_is_a_named_error(tmp_path: Path, text: str,
                                                       why: str) -> None:
    # json.loads raised RecursionError and, for an integer past 4,300 digits, a plain
    # ValueError: neither was a SamplesFileError, so `--refit` ended in a traceback.
    path = tmp_path / "s.json"
    path.write_text(text)
    with pytest.raises(SamplesFileError, match=rf"s\.json: cannot read calibration samples "
                                               rf"\(not valid JSON: {why}\)"):
        read_samples(path)


def test_refit_of_values_no_profile_takes_exits_2_and_writes_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rec = measure(_target(SyntheticExecutor()), CalibrationOptions(grid=QUICK, repeats=1))
    path = write_samples(rec, tmp_path / "s.json")
    doc = json.loads(path.read_text())
    doc["device"]["type"] = "tpu"
    path.write_text(json.dumps(doc))
    out = tmp_path / "p.yaml"
    assert main(["calibrate", "--refit", str(path), "--out", str(out)]) == 2
    assert "s.json: device.type: expected one of cpu, cuda" in capsys.readouterr().err
    assert not out.exists()


def test_refit_of_a_file_whose_profile_would_not_read_back_exits_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Any other field the profile bounds (threads >= 1 here) is caught as the refitted
    # profile is read back before writing: an error naming the samples file, no file.
    rec = measure(_target(SyntheticExecutor()), CalibrationOptions(grid=QUICK, repeats=1))
    path = write_samples(rec, tmp_path / "s.json")
    doc = json.loads(path.read_text())
    doc["device"]["threads"] = 0
    path.write_text(json.dumps(doc))
    out = tmp_path / "p.yaml"
    assert main(["calibrate", "--refit", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: the profile fitted to it would not read back" in err
    assert "device.threads=0: must be at least 1" in err and not out.exists()


@pytest.mark.timeout(30)  # its read waited for a writer for ever
def test_a_pipe_named_as_samples_is_refused_unread(tmp_path: Path) -> None:
    import os

    os.mkfifo(tmp_path / "s.json")
    with pytest.raises(SamplesFileError, match=r"s\.json: cannot read calibration samples "
                                               r"\(is a named pipe \(FIFO\), not a regular"):
        read_samples(tmp_path / "s.json")


def _refit(tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: Any = None,
           *extra: str) -> tuple[int, str, str, Path]:
    """``calibrate --refit`` of a quick synthetic recording, ``edit`` applied to its
    JSON first: (exit status, stdout, stderr, --out)."""
    rec = measure(_target(SyntheticExecutor()), CalibrationOptions(grid=QUICK, repeats=1))
    path = write_samples(rec, tmp_path / "s.json")
    if edit is not None:
        doc = json.loads(path.read_text())
        edit(doc)
        path.write_text(json.dumps(doc))
    out = tmp_path / "p.yaml"
    status = main(["calibrate", "--refit", str(path), "--out", str(out), *extra])
    printed = capsys.readouterr()
    return status, printed.out, printed.err, out


def test_a_refit_of_fewer_shapes_than_coefficients_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # One shape was fitted exactly by 8 coefficients and reported as 0.0 % error.
    def one(doc: dict[str, Any]) -> None:
        doc["samples"] = doc["samples"][:1]

    status, _, err, out = _refit(tmp_path, capsys, one)
    assert status == 2 and not out.exists(), err
    assert "the recording's 1 shape(s) cannot determine the 8 coefficients" in err, err
    assert "'prefill': 1 shape(s) for its 8 own coefficients" in err, err


def test_a_class_with_fewer_shapes_than_its_own_coefficients_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def one_swap(doc: dict[str, Any]) -> None:
        swaps = [i for i, s in enumerate(doc["samples"]) if s["group"] == "swap"]
        assert len(swaps) == 2
        del doc["samples"][swaps[0]]

    status, _, err, out = _refit(tmp_path, capsys, one_swap)
    assert status == 2 and not out.exists(), err
    assert "'swap': 1 shape(s) for its 2 own coefficients (swap_batches, swap_blocks)" \
        in err, err


def test_the_fit_table_says_its_errors_are_in_sample_and_which_rows_are_exact(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The swap row, 2 shapes for the 2 coefficients only swaps exercise, read 0.0 %: an
    # error of 0 by construction, beside rows whose error tells how well the form fits.
    status, printed, err, _ = _refit(tmp_path, capsys)
    assert status == 0, err
    assert "in-sample" in printed, printed
    swap = next(line for line in printed.splitlines() if line.lstrip("│ ").startswith("swap"))
    assert "exactly determined" in swap, printed
    decode = next(line for line in printed.splitlines()
                  if line.lstrip("│ ").startswith("decode"))
    assert "exactly determined" not in decode
    status, printed, err, _ = _refit(tmp_path / "j", capsys, None, "--json")
    brief = json.loads(printed)
    assert brief["in_sample"] is True and brief["classes"]["swap"]["exactly_determined"]
    assert not brief["classes"]["decode"]["exactly_determined"]


@pytest.mark.parametrize("field", ["seconds", "times"])
def test_a_time_in_the_file_that_is_no_time_names_the_file_not_the_executor(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str) -> None:
    def zero(doc: dict[str, Any]) -> None:
        sample = doc["samples"][3]
        sample[field] = 0.0 if field == "seconds" else [0.0] * len(sample["times"])

    status, _, err, out = _refit(tmp_path, capsys, zero, "--statistic", "min")
    assert status == 2 and not out.exists(), err
    assert f"s.json: samples[3].{field}: expected " in err and "positive" in err, err
    assert "the executor returned" not in err, err


def _every_step(change: Any) -> Any:
    def edit(doc: dict[str, Any]) -> None:
        for i, step in enumerate(doc["host_steps"]):
            change(i, step)
    return edit


def test_a_refit_of_steps_that_hold_less_than_their_executor_writes_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def doubled(i: int, step: dict[str, Any]) -> None:
        step["executor_s"] = 2 * step["step_s"]

    status, _, err, out = _refit(tmp_path, capsys, _every_step(doubled))
    assert status == 2 and not out.exists(), err
    assert "s.json: host_steps[0].executor_s=" in err and "exceeds step_s=" in err, err


def _erratic_loop(i: int, step: dict[str, Any]) -> None:
    # Every row possible (the executor inside its step), but the loop's time swings
    # between 80 % of a step and none on alike steps: no form of the loop fits that.
    step["executor_s"] = step["step_s"] * (0.2 if i % 2 else 1.0)


def test_an_engine_loop_fit_outside_the_tolerance_writes_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err, out = _refit(tmp_path, capsys, _every_step(_erratic_loop))
    assert status == 2 and not out.exists(), err
    assert "the engine loop's fit: mean error per step" in err, err
    assert "above --tolerance 0.1" in err and "worst steps: step " in err, err
    assert "--no-host" in err and "Nothing was written." in err, err
    # The same recording, accepted as the message says it can be.
    status, _, err, out = _refit(tmp_path / "t", capsys, _every_step(_erratic_loop),
                                 "--tolerance", "10")
    assert status == 0 and out.exists(), err
    assert load_profile(out).fit.host_mape > 0.1  # type: ignore[union-attr]
    status, _, err, out = _refit(tmp_path / "n", capsys, _every_step(_erratic_loop),
                                 "--no-host")
    assert status == 0 and out.exists(), err


def test_the_host_fit_is_judged_by_the_runner_too(tmp_path: Path) -> None:
    rec = measure(_target(SyntheticExecutor()), CalibrationOptions(grid=QUICK, repeats=1))
    path = write_samples(rec, tmp_path / "s.json")
    doc = json.loads(path.read_text())
    _every_step(_erratic_loop)(doc)
    path.write_text(json.dumps(doc))
    with pytest.raises(FitError, match=r"engine loop's fit: mean error per step \d+\.\d%"):
        fit_recording(read_samples(path))


KEPT = sorted((Path(__file__).parents[3] / "docs" / "data").glob("*samples*.json"))


@pytest.mark.parametrize("path", KEPT, ids=[p.name for p in KEPT])
def test_the_kept_real_recordings_refit_within_the_default_tolerance(path: Path) -> None:
    # Real calibrations (an H200, this project's 2-core EPYC): judging the engine loop's
    # fit as well must not refuse them (their loops fit to 0.6-2 % a step).
    fit = fit_recording(read_samples(path))
    assert fit.host_fit is not None and fit.host_fit.mape < 0.05


@pytest.mark.parametrize("spelling", ["same", "symlink"])
def test_a_refit_refuses_to_write_its_profile_over_its_samples(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], spelling: str) -> None:
    # The samples were the only copy of minutes of timing; the profile replaced them.
    rec = measure(_target(SyntheticExecutor()), CalibrationOptions(grid=QUICK, repeats=1))
    samples = write_samples(rec, tmp_path / "s1.json")
    before = samples.read_bytes()
    out = samples
    if spelling == "symlink":
        out = tmp_path / "p.yaml"
        out.symlink_to(samples)
    assert main(["calibrate", "--refit", str(samples), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"--out {out} is the same file as --refit {samples}" in err, err
    assert "give --out another path" in err
    assert samples.read_bytes() == before


def test_a_key_given_twice_in_a_samples_file_is_refused(tmp_path: Path) -> None:
    rec = measure(_target(SyntheticExecutor()), CalibrationOptions(grid=QUICK, repeats=1))
    path = write_samples(rec, tmp_path / "s.json")
    text = path.read_text()
    path.write_text(text[:text.index("{") + 1] + '"schema": "x",' + text[text.index("{") + 1:])
    with pytest.raises(SamplesFileError, match=r"s\.json: cannot read calibration samples "
                                               r"\('schema' given twice"):
        read_samples(path)


@pytest.mark.parametrize("flags", [
    ["--device", "cuda"], ["--device", "cpu"], ["--threads", "4"], ["--repeats", "9"],
    ["--quick"], ["--dtype", "float32"], ["--cpu-kernels", "auto"],
    ["--decode-graphs", "off"], ["--piecewise-graphs", "off"], ["--token-budget", "64"],
    ["--max-num-seqs", "8"], ["--max-context", "256"], ["--kv-cache-gb", "1"],
    ["--device", "cuda", "--threads", "4", "--quick", "--repeats", "9"],  # in --help order
    # 0 == False: "not in (None, False)" let a zero through.
    ["--threads", "0"], ["--repeats", "0"], ["--kv-cache-gb", "0"],
])
def test_a_refit_refuses_the_flags_that_time_where_given(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str]) -> None:
    # They were ignored without a word (only --model and --samples-out were refused):
    # `--refit s.json --quick --threads 4 --repeats 9 --device cuda` wrote a profile.
    rec = measure(_target(SyntheticExecutor()), CalibrationOptions(grid=QUICK, repeats=1))
    samples = write_samples(rec, tmp_path / "s.json")
    out = tmp_path / "p.yaml"
    assert main(["calibrate", "--refit", str(samples), "--out", str(out), *flags]) == 2
    err = capsys.readouterr().err
    named = ", ".join(f for f in flags if f.startswith("--"))
    assert err == (f"slopilot calibrate: --refit fits timings already taken: it takes no "
                   f"{named} (they set how the executor is timed; the samples file "
                   "records how it was)\n"), err
    assert not out.exists()
    # Left out, their defaults are no flags given: the refit runs.
    assert main(["calibrate", "--refit", str(samples), "--out", str(out)]) == 0
