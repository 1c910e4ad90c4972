"""Cost profile files: round trip, atomic writes, and every way a file can be wrong."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest
import yaml

from slopilot.engine.sim import profile_file
from slopilot.engine.sim.profile_file import (
    SCHEMA,
    ProfileFileError,
    StaleProfileWarning,
    check_profile_for,
    dump_profile,
    load_profile,
    profile_to_dict,
    write_profile,
)
from slopilot.engine.sim.shape import FEATURES, FORM_VERSION, shape_of_rows
from tests.support.profiles import COEFFICIENTS, HOST, make_profile
from tests.support.profiles import profile_file as write_test_profile


def test_round_trip_keeps_every_field(tmp_path: Path) -> None:
    original = make_profile()
    path = write_profile(original, tmp_path / "p.yaml")
    loaded = load_profile(path)
    assert loaded.source == str(path)
    assert loaded == original.__class__(**{**original.__dict__, "source": str(path)})
    assert load_profile(dump_profile(original)).executor == original.executor


def test_the_file_says_what_it_is(tmp_path: Path) -> None:
    text = write_test_profile(tmp_path).read_text()
    doc = yaml.safe_load(text)
    assert text.startswith("# slopilot cost profile")
    assert doc["schema"] == SCHEMA
    assert set(doc) >= {"device", "model", "memory", "cost_model", "fit", "versions", "code",
                        "created"}
    assert doc["cost_model"]["version"] == FORM_VERSION


def test_write_is_atomic_and_leaves_nothing_behind(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    target = write_test_profile(tmp_path)
    before = target.read_text()

    def crash(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        write_profile(make_profile(name="another"), target)
    assert target.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name]


def _broken(tmp_path: Path, edit: dict[str, object], drop: str | None = None) -> Path:
    doc = profile_to_dict(make_profile())
    for dotted, value in edit.items():
        *parents, key = dotted.split(".")
        node = doc
        for p in parents:
            node = node[p]
        node[key] = value
    if drop:
        *parents, key = drop.split(".")
        node = doc
        for p in parents:
            node = node[p]
        del node[key]
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize(("edit", "drop", "message"), [
    ({"schema": "something/else"}, None, r"schema='something/else': not a slopilot cost"),
    ({"device.type": "tpu"}, None, r"device.type='tpu'.*use one of: cpu, cuda"),
    ({"cost_model.executor.tokens": -1.0}, None, r"tokens=-1.0: a time per unit must be in"),
    ({"cost_model.executor.tokens": 1e300}, None, r"tokens=1e\+300: a time per unit must"),
    ({"memory.kv_cache_bytes": 2 ** 60}, None, r"kv_cache_bytes=1152921504606846976: must be "
                                              r"at most"),
    ({"cost_model.executor.warp_drive": 1.0}, None, r"warp_drive.*unknown feature"),
    ({"cost_model.executor.tokens": "fast"}, None, r"tokens='fast': expected a number"),
    ({"cost_model.version": FORM_VERSION + 1}, None, r"newer slopilot.*upgrade"),
    ({"cost_model.form": "roofline"}, None, r"cost_model.form='roofline'"),
    ({"model.shape.num_layers": 0}, None, r"model.shape.*num_layers=0"),
    # Blamed on memory.kv_cache_bytes ("holds no block of 16 tokens").
    ({"model.shape.num_layers": 10 ** 12}, None,
     r"model.shape.num_layers=1000000000000: must be at most 1,024 \(the deepest"),
    # Reported as "versions={...}: versions and code must be mappings".
    ({"code": "x"}, None, r"broken.yaml: code='x': expected a mapping \(code: \{executor: "),
    ({"versions": [1, 2]}, None, r"broken.yaml: versions=\[1, 2\]: expected a mapping \(ver"),
    ({"memory.block_size": 0}, None, r"memory.block_size=0: must be at least 1"),
    ({}, "cost_model.executor", r"cost_model.executor is required but missing"),
    ({"model.colour": "red"}, None, r"model.colour: unknown key"),
    # No guess at the model's context: the twin refuses requests longer than it.
    ({}, "model.shape.max_position_embeddings",
     r"model.shape: missing field\(s\) max_position_embeddings \(the model's context"),
])
def test_malformed_profiles_name_the_file_field_and_fix(
        tmp_path: Path, edit: dict[str, object], drop: str | None, message: str) -> None:
    path = _broken(tmp_path, edit, drop)
    with pytest.raises(ProfileFileError, match=message) as err:
        load_profile(path)
    assert str(path) in str(err.value) and "slopilot calibrate" in str(err.value)


def test_yaml_1_1_exponents_without_a_dot_read_as_numbers(tmp_path: Path) -> None:
    path = _broken(tmp_path, {"cost_model.executor.tokens": "2e-5"})
    assert load_profile(path).executor["tokens"] == 2e-5


@pytest.mark.parametrize("text", ["{not: [yaml", "- just\n- a list\n", "\n"])
def test_not_a_profile_at_all(text: str) -> None:
    with pytest.raises(ProfileFileError, match="slopilot calibrate"):
        load_profile(text if "\n" in text else text + "\n")


def test_a_huge_file_is_refused_before_parsing(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_text("a: " + "x" * 300_000 + "\n")
    with pytest.raises(ProfileFileError, match="bytes is no cost profile"):
        load_profile(path)
    with pytest.raises(ProfileFileError, match="bytes is no cost profile"):
        load_profile(path.read_text())


def test_an_alias_bomb_is_refused_without_expanding_it() -> None:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    bomb = "\n".join(lines) + "\nschema: *a8\n"  # 9**9 strings if anything walked it
    with pytest.raises(ProfileFileError, match=r"not valid YAML \(its aliases"):
        load_profile(bomb)


def test_a_missing_file_says_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(ProfileFileError, match=r"nope\.yaml: no such file.*slopilot calibrate"):
        load_profile(tmp_path / "nope.yaml")


def test_a_file_that_cannot_be_read_is_said_in_words(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # It showed Python's "[Errno 21] Is a directory: '...'".
    with pytest.raises(ProfileFileError) as info:
        load_profile(tmp_path)
    assert str(info.value).startswith(f"{tmp_path}: is a folder, not a file")
    assert "Errno" not in str(info.value)
    path = write_test_profile(tmp_path)

    def denied(path: Path, limit: int) -> bytes:
        raise PermissionError(13, "Permission denied", str(path))

    # root reads any file: a chmod can't refuse it
    monkeypatch.setattr(profile_file, "read_bounded", denied)
    with pytest.raises(ProfileFileError) as info:
        load_profile(path)
    assert str(info.value) == f"{path}: this user may not read it (permission denied)"


def test_an_older_cost_model_form_warns(tmp_path: Path) -> None:
    path = write_test_profile(tmp_path, form_digest="0000000000000000")
    with pytest.warns(StaleProfileWarning, match=r"fitted on cost-model form.*re-run"):
        profile = load_profile(path)
    assert profile.coefficient("tokens") > 0  # still usable


def test_other_executor_code_warns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_test_profile(tmp_path, executor_code="aaaaaaaaaaaaaaaa")
    monkeypatch.setattr(profile_file, "executor_code_hash", lambda: "bbbbbbbbbbbbbbbb")
    with pytest.warns(StaleProfileWarning, match=r"executor code aaaa.*bbbb.*re-run"):
        load_profile(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_profile(path, warn=False)


def test_the_executor_code_hash_tracks_the_source() -> None:
    assert profile_file.executor_code_hash() == profile_file.executor_code_hash()
    assert len(profile_file.executor_code_hash()) == 16


@pytest.mark.parametrize("rel", ["executors/csrc/cpu_kernels.cpp", "executors/kernels.py",
                                 "executors/native_kernels.py", "executors/llama.py",
                                 "scheduler.py"])
def test_the_executor_code_hash_changes_with_any_source_that_times_a_step(
        tmp_path: Path, rel: str) -> None:
    # The fused CPU kernels set most of a CPU step's non-GEMM time: a profile fitted
    # before they changed must read as stale, like one fitted before llama.py changed.
    engine = Path(profile_file.__file__).resolve().parents[1]
    for src in engine.rglob("*"):
        if src.suffix in (".py", ".cpp") and "__pycache__" not in src.parts:
            dest = tmp_path / src.relative_to(engine)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(src.read_bytes())
    before = profile_file.executor_code_hash(tmp_path)
    assert before == profile_file.executor_code_hash()
    with (tmp_path / rel).open("a") as f:
        f.write("\n// changed\n" if rel.endswith(".cpp") else "\n# changed\n")
    assert profile_file.executor_code_hash(tmp_path) != before


def test_a_profile_for_another_model_device_or_tp_is_refused() -> None:
    p = make_profile("llama-3-8b", device="cpu")
    check_profile_for(p, model="Meta-Llama-3-8B", device="cpu", tp=1)  # aliases match
    check_profile_for(p, model="/models/llama-3-8b/")
    with pytest.raises(ProfileFileError, match=r"calibrated for model 'Llama-3-8B', not "
                                               r"'smollm2-135m'.*slopilot calibrate"):
        check_profile_for(p, model="smollm2-135m")
    with pytest.raises(ProfileFileError, match=r"on a cpu device.*not 'cuda:0'"):
        check_profile_for(p, device="cuda:0")
    with pytest.raises(ProfileFileError, match=r"tp=1, not tp=8"):
        check_profile_for(p, tp=8)


def test_the_fix_for_another_models_profile_is_a_command_calibrate_takes() -> None:
    # calibrate's --model takes a registered model or a checkpoint directory: it refuses
    # 'llama-3-8b', which the message for tiny-cpu's scenario told users to run.
    p = make_profile("smollm2-135m", device="cpu")
    with pytest.raises(ProfileFileError) as err:
        check_profile_for(p, model="llama-3-8b")
    assert "--model llama-3-8b" not in str(err.value)
    assert "`slopilot calibrate --model DIR ...` with DIR a checkpoint of 'llama-3-8b'" \
        in str(err.value)
    with pytest.raises(ProfileFileError, match=r"`slopilot calibrate --model smollm2-135m "):
        check_profile_for(make_profile("llama-3-8b", device="cpu"), model="smollm2-135m")


def test_the_cache_size_round_trips_and_places_the_spill_knee(tmp_path: Path) -> None:
    import dataclasses

    from slopilot.engine.sim.calibrated import CalibratedCostModel
    from slopilot.engine.sim.profile_file import DeviceInfo

    profile = dataclasses.replace(
        make_profile(executor={**COEFFICIENTS, "decode_spill": 1e-6}),
        device=DeviceInfo("cuda", "Test Device 1", None, 50 * 1024 ** 2))
    path = write_profile(profile, tmp_path / "p.yaml")
    loaded = load_profile(path)
    assert loaded.device.cache_bytes == 50 * 1024 ** 2
    # llama-3-8b in bf16: 8 KV heads x 128 x 2 bytes x (K, V) = 4 KiB per layer and token.
    assert loaded.decode_knee_tokens == 50 * 1024 ** 2 // 4096 == 12800
    cost = CalibratedCostModel(loaded)
    assert cost.decode_knee_tokens == 12800
    batch = [(1, 999, True)] * 16  # 16 000 padded tokens: 3200 beyond the knee
    without = dict(COEFFICIENTS)
    assert cost.iteration_time([(n, c) for n, c, _ in batch]) == pytest.approx(
        sum(without[f] * v for f, v in zip(FEATURES, shape_of_rows(batch).vector(),
                                            strict=True) if f in without)
        + HOST["iteration"] + 16 * HOST["decode_seqs"] + 3200 * 1e-6)


def test_a_profile_from_form_1_loads_with_a_warning_and_no_spill(tmp_path: Path) -> None:
    path = write_test_profile(tmp_path)
    doc = yaml.safe_load(path.read_text())
    doc["cost_model"].update(version=1, hash="02e19ace97821c15")
    del doc["device"]["cache_bytes"]  # form-1 profiles did not record the cache
    path.write_text(yaml.safe_dump(doc))
    with pytest.warns(StaleProfileWarning, match=r"form linear-shape-features v1"):
        old = load_profile(path)
    assert old.device.cache_bytes is None and old.decode_knee_tokens is None
    assert old.coefficient("decode_spill") == 0.0 and old.coefficient("tokens") > 0


def test_the_kernels_a_profile_was_timed_with_round_trip(tmp_path: Path) -> None:
    import dataclasses

    from slopilot.engine.sim.profile_file import DeviceInfo

    for kernels in ("native", "torch"):
        profile = dataclasses.replace(
            make_profile("smollm2-135m", device="cpu"),
            device=DeviceInfo("cpu", "Test CPU (2 cores)", 2, None, kernels))
        assert load_profile(write_profile(profile, tmp_path / "p.yaml")).device.kernels \
            == kernels
    # A profile from before the field: the kernels are unknown, not guessed.
    doc = yaml.safe_load(dump_profile(make_profile("smollm2-135m", device="cpu")))
    assert "kernels" not in doc["device"]
    assert load_profile(yaml.safe_dump(doc)).device.kernels is None


@pytest.mark.parametrize("bad", ["avx512", "", 3, ["native"]])
def test_unknown_kernels_in_a_profile_are_refused_by_name(bad: object) -> None:
    doc = yaml.safe_load(dump_profile(make_profile("smollm2-135m", device="cpu")))
    doc["device"]["kernels"] = bad
    with pytest.raises(ProfileFileError, match=r"device\.kernels.*(native|non-empty)"):
        load_profile(yaml.safe_dump(doc))


def test_a_cuda_graph_profile_charges_eager_passes_only(tmp_path: Path) -> None:
    import dataclasses

    from slopilot.engine.sim.calibrated import CalibratedCostModel
    from slopilot.engine.sim.profile_file import DeviceInfo

    profile = dataclasses.replace(
        make_profile(executor={**COEFFICIENTS, "eager_passes": 0.02}),
        device=DeviceInfo("cuda", "Test Device 1", None, None, "cuda-graphs"))
    loaded = load_profile(write_profile(profile, tmp_path / "p.yaml"))
    assert loaded.device.kernels == "cuda-graphs" and loaded.device.graph_batch == 256
    cost = CalibratedCostModel(loaded)
    decode = cost.iteration_time([(1, 99)] * 8)
    mixed = cost.iteration_time([(1, 99)] * 8 + [(64, 0)])
    # The chunk's own terms, plus one eager pass of 20 ms (and the eager decode batch).
    assert mixed - decode > 0.02
    eager = CalibratedCostModel(dataclasses.replace(
        loaded, device=DeviceInfo("cuda", "Test Device 1", None, None, "torch")))
    assert eager.graph_batch is None
    assert eager.iteration_time([(1, 99)] * 8 + [(64, 0)]) - \
        eager.iteration_time([(1, 99)] * 8) < 0.02


@pytest.mark.parametrize("field", ["versions:\n  slopilot: ", "code:\n  executor: ",
                                   "created: ", "      worst: "])
def test_an_alias_bomb_in_a_field_read_as_text_is_refused(field: str) -> None:
    # Fields taken with str() walked every alias: 9**9 strings were minutes and
    # gigabytes (an operator reading a tenant's profile stalled); 9**7 load in a second.
    # The anchors sit in ``versions``, whose keys are free.
    anchors = ["  a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    anchors += [f"  a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 7)]
    text = dump_profile(make_profile())
    start = text.index(field) + len(field)
    text = text[:start] + "*a6" + text[text.index("\n", start):]
    text = text.replace("versions:\n", "versions:\n" + "\n".join(anchors) + "\n")
    if field == "created: ":  # above the anchors: move it below them
        text = text.replace("created: *a6\n", "") + "created: *a6\n"
    with pytest.raises(ProfileFileError, match=r"not valid YAML \(its aliases .* expand it "
                                               r"to more than 100,000 values"):
        load_profile(text)

def test_a_profile_nested_past_the_parsers_depth_is_refused() -> None:
    text = dump_profile(make_profile()).replace(
        "slopilot: 0.1.0", "slopilot: " + "[" * 5000 + "]" * 5000)
    with pytest.raises(ProfileFileError, match=r"<profile text>: not valid YAML \(nested "):
        load_profile(text)


@pytest.mark.parametrize(("line", "field", "words"), [
    ("created: 2026-02-30", "created", "day is out of range for month"),
    ("num_layers: " + "9" * 5000, "model.shape.num_layers", "4300 digits"),
])
def test_a_value_yaml_cannot_convert_names_the_file_the_field_and_the_fix(
        tmp_path: Path, line: str, field: str, words: str) -> None:
    # Python's words alone escaped every handler: "slopilot simulate: day is out of
    # range for month", or int's limit with its sys.set_int_max_str_digits() fix.
    key = line.split(":")[0] + ":"
    text = "\n".join(old[:old.index(key)] + line if old.lstrip().startswith(key) else old
                     for old in dump_profile(make_profile()).splitlines()) + "\n"
    path = tmp_path / "p.yaml"
    path.write_text(text)
    with pytest.raises(ProfileFileError) as err:
        load_profile(path)
    message = str(err.value)
    assert message.startswith(f"{path}: {field} (line "), message
    assert words in message and "quote it" in message, message
    assert "set_int_max_str_digits" not in message and len(message) < 500, message


def _special(tmp_path: Path, kind: str) -> Path:
    """A FIFO, /dev/zero, or a link to either: each said its size was 0."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    target = fifo if "fifo" in kind else Path("/dev/zero")
    if not kind.startswith("link"):
        return target
    link = tmp_path / "link.yaml"
    link.symlink_to(target)
    return link


@pytest.mark.timeout(30)  # a FIFO's read waited for a writer for ever
@pytest.mark.parametrize("kind", ["fifo", "link to fifo", "zero", "link to zero"])
def test_a_device_or_a_pipe_named_as_a_profile_is_refused_unread(tmp_path: Path,
                                                                 kind: str) -> None:
    # `--profile /dev/zero` read until MemoryError: its size, 0, was the only bound.
    path = _special(tmp_path, kind)
    with pytest.raises(ProfileFileError) as err:
        load_profile(path)
    what = "a named pipe (FIFO)" if "fifo" in kind else "a character device"
    assert str(err.value).startswith(f"{path}: is {what}, not a regular file"), err.value


@pytest.mark.timeout(30)
def test_a_scenarios_profile_that_is_a_pipe_is_refused_unread(tmp_path: Path) -> None:
    from slopilot.engine.sim.scenario import ScenarioError, load_scenario

    _special(tmp_path, "fifo")
    scenario = tmp_path / "s.yaml"
    scenario.write_text("name: s\ngpu: H100\nmodel: llama-3-8b\nduration_s: 10\n"
                        "profile: fifo\nworkload: {type: open_loop, arrivals: {process: "
                        "poisson, rate: 1}, prompt_tokens: 10, output_tokens: 4}\n")
    with pytest.raises((ProfileFileError, ScenarioError), match="named pipe"):
        load_scenario(scenario)


@pytest.mark.parametrize(("executor", "host", "cheapest"), [
    ({f: 0.0 for f in FEATURES}, {}, "0 us"),  # TTFT 0 ms, 100% within SLO, busy 0 %
    ({"iteration": 1e-12}, {}, "1e-06 us"),  # "ETA 116127 h"
    ({"iteration": 1e-300}, {}, "1e-294 us"),
    ({"iteration": 4e-6, "tokens": 1e-6}, {"iteration": 2e-6}, "7 us"),
    # A decode samples, so it costs 1 ms; a 2-token chunk samples nothing and costs 0.
    ({"sampled": 1e-3}, {}, "0 us"),
])
def test_a_profile_whose_cheapest_step_takes_no_real_time_is_refused(
        tmp_path: Path, executor: dict[str, float], host: dict[str, float],
        cheapest: str) -> None:
    # Each coefficient was checked to lie in [0, 60] s and nothing floored their sum: a
    # profile of zeros was a twin of unlimited capacity, and a closed loop on it hung.
    path = _broken(tmp_path, {"cost_model.executor": executor, "cost_model.host": host})
    with pytest.raises(ProfileFileError) as err:
        load_profile(path)
    message = str(err.value)
    assert message.startswith(f"{path}: cost_model: the cheapest step "), message
    assert f"takes {cheapest} (executor.iteration=" in message, message
    assert "no engine step takes under 10 us" in message and "slopilot calibrate" in message


def test_the_cheapest_real_profiles_are_above_the_floor(tmp_path: Path) -> None:
    # The fastest steps calibrated here: tiny-random's 2 layers on a CPU (0.5 ms), an
    # H200 replaying CUDA graphs (2.5 ms); and one just at the floor.
    h200 = Path(__file__).parents[3] / "docs" / "data" / "h200-profile-2026-12-04-graphs.yaml"
    assert load_profile(h200, warn=False).cheapest_step_s() > 2e-3
    tiny = {"iteration": 4.5e-4, "sampled": 4.7e-6, "prefill_seqs": 8.4e-5}
    assert load_profile(_broken(tmp_path, {"cost_model.executor": tiny}), warn=False) \
        .cheapest_step_s() > 5e-4
    at_floor = _broken(tmp_path, {"cost_model.executor": {"iteration": 1e-5},
                                  "cost_model.host": {}})
    assert load_profile(at_floor).cheapest_step_s() == 1e-5


def test_a_key_given_twice_names_the_file_and_lines(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    text = dump_profile(make_profile())
    path.write_text(text + "name: another\n")
    with pytest.raises(ProfileFileError) as err:
        load_profile(path)
    first = next(i for i, line in enumerate(text.splitlines(), 1)
                 if line.startswith("name:"))
    assert str(err.value).startswith(
        f"{path}: name given twice (line {first}, then line {len(text.splitlines()) + 1})")
