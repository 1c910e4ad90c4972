"""The calibrated cost model, and the simulator and scenarios running on it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from slopilot.engine.outputs import ScheduledSeq, SchedulerOutput
from slopilot.engine.request import Priority, SamplingParams
from slopilot.engine.sim.calibrated import CalibratedCostModel
from slopilot.engine.sim.cost_model import CostModel
from slopilot.engine.sim.profile_file import ProfileFileError
from slopilot.engine.sim.scenario import ScenarioError, load_scenario
from slopilot.engine.sim.shape import FEATURES, shape_of_rows
from slopilot.engine.sim.simulator import simulate
from slopilot.engine.sim.twin import cost_model_for, twin_label, with_profile
from tests.support.profiles import COEFFICIENTS, HOST, make_profile, profile_file


def test_time_is_the_coefficients_dotted_with_the_features() -> None:
    cm = CalibratedCostModel(make_profile())
    rows = [(1, 100, True), (1, 300, True), (64, 32, True)]
    shape = shape_of_rows(rows)
    expected = sum((COEFFICIENTS.get(f, 0) + HOST.get(f, 0)) * v
                   for f, v in zip(FEATURES, shape.vector(), strict=True))
    assert cm.shape_time(shape) == pytest.approx(expected)
    assert cm.iteration_time([(1, 100), (1, 300), (64, 32)]) == pytest.approx(expected)
    executor = sum(COEFFICIENTS.get(f, 0) * v
                   for f, v in zip(FEATURES, shape.vector(), strict=True))
    assert cm.executor_time(shape) == pytest.approx(executor)
    assert cm.iteration_time([]) == 0.0


def test_output_time_charges_swaps_scaled_by_block_size() -> None:
    cm = CalibratedCostModel(make_profile())
    sp = SamplingParams()
    out = SchedulerOutput(seqs=[ScheduledSeq("a", [7], 20, [0, 1], True, sp)],
                          swap_out=[(5, 0), (6, 1)])
    base = cm.output_time(SchedulerOutput(seqs=out.seqs), 16)
    per_block, per_call = COEFFICIENTS["swap_blocks"], COEFFICIENTS["swap_batches"]
    assert cm.output_time(out, 16) == pytest.approx(base + per_call + 2 * per_block)
    assert cm.output_time(out, 32) == pytest.approx(base + per_call + 4 * per_block)
    assert cm.swap_time_per_block(32) == pytest.approx(2 * per_block)
    # One direction's copies, as the simulated executor reports them: the call and blocks.
    assert cm.swap_time(2, 16) == pytest.approx(per_call + 2 * per_block)
    assert cm.swap_time(2, 32) == pytest.approx(per_call + 4 * per_block)
    assert cm.swap_time(0, 16) == 0.0


def test_kv_sizing_comes_from_the_calibrated_cache() -> None:
    p = make_profile(kv_gib=1.0)
    cm = CalibratedCostModel(p)
    per_token = p.model.kv_bytes_per_token
    assert cm.num_kv_blocks(16) == 1024 ** 3 // (16 * per_token)
    assert cm.num_cpu_blocks(16, 2.0) == 2 * 1024 ** 3 // (16 * per_token)
    with pytest.raises(ValueError, match="holds no block"):
        CalibratedCostModel(make_profile(kv_gib=0.0)).num_kv_blocks(16)


def test_labels_say_calibrated_or_datasheet() -> None:
    scenario = load_scenario("tiny-cpu")
    assert twin_label(scenario) == "uncalibrated datasheet roofline (A100-80GB, tp=1)"
    assert isinstance(cost_model_for(scenario), CostModel)
    on_profile = with_profile(scenario, make_profile())
    assert twin_label(on_profile) == "calibrated profile <memory>"
    assert isinstance(cost_model_for(on_profile), CalibratedCostModel)
    assert CostModel("a100", "llama-3-8b").label.startswith("uncalibrated datasheet roofline")


def test_the_simulator_runs_on_a_profile_and_says_so() -> None:
    scenario = load_scenario("tiny-cpu")
    datasheet = simulate(scenario, duration_s=10).summary
    slow = make_profile(executor={**COEFFICIENTS, "iteration": 0.03})
    calibrated = simulate(with_profile(scenario, slow), duration_s=10).summary
    assert datasheet.run is not None and calibrated.run is not None
    assert (datasheet.run.calibrated, calibrated.run.calibrated) == (False, True)
    assert calibrated.run.twin.startswith("calibrated profile")
    # A 30 ms floor per iteration shows in every gap between tokens.
    slow_tbt, fast_tbt = (s.classes[Priority.P1].to_dict()["tbt_p50_ms"]
                          for s in (calibrated, datasheet))
    assert slow_tbt > 30 > fast_tbt


def test_a_profile_for_another_model_is_refused_by_name() -> None:
    with pytest.raises(ProfileFileError, match=r"scenario tiny-cpu: .*calibrated for model "
                                               r"'SmolLM2-135M', not 'llama-3-8b'"):
        with_profile(load_scenario("tiny-cpu"), make_profile("smollm2-135m"))


def _scenario_file(tmp_path: Path, **changes: object) -> Path:
    data = yaml.safe_load(Path("slopilot/data/scenarios/tiny-cpu.yaml").read_text())
    data.pop("gpu")
    data.update(changes)
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_scenario_can_name_a_profile_file_relative_to_itself(tmp_path: Path) -> None:
    profile_file(tmp_path, "hw.yaml")
    scenario = load_scenario(_scenario_file(tmp_path, profile="hw.yaml"))
    assert scenario.profile is not None and scenario.gpu == "Test Device 1"
    assert twin_label(scenario) == f"calibrated profile {tmp_path / 'hw.yaml'}"


@pytest.mark.parametrize(("changes", "message"), [
    ({"profile": "missing.yaml"}, r"profile: .*missing\.yaml: no such file; write one"),
    ({"profile": 3}, r"profile=3: expected the path of a calibrated profile file"),
    ({"profile": "hw.yaml", "model": "deepseek-67b"},
     r"profile: .*calibrated for model 'Llama-3-8B', not 'deepseek-67b'"),
    ({}, r"gpu is required but missing"),
])
def test_bad_profile_references_in_a_scenario(tmp_path: Path, changes: dict[str, object],
                                              message: str) -> None:
    profile_file(tmp_path, "hw.yaml")
    with pytest.raises(ScenarioError, match=message):
        load_scenario(_scenario_file(tmp_path, **changes))


def test_the_exported_iteration_series_obey_the_profile_equation() -> None:
    """A controller's refit rests on this: over a run, the summed step time equals the
    coefficients dotted with the summed shape features, per kind."""
    profile = make_profile()
    run = simulate(with_profile(load_scenario("tiny-cpu"), profile), duration_s=10,
                   with_metrics=True)
    fams = {f.name: f for f in text_string_to_metric_families(run.metrics[0].decode())}
    seconds = {s.labels["kind"]: s.value for s in fams["slopilot_iteration_seconds"].samples
               if s.name.endswith("_sum")}
    shape: dict[str, dict[str, float]] = {}
    for s in fams["slopilot_iteration_shape"].samples:
        shape.setdefault(s.labels["kind"], {})[s.labels["feature"]] = s.value
    assert seconds["decode"] > 0 and seconds["mixed"] > 0
    for kind, features in shape.items():
        predicted = sum(profile.coefficient(f) * v for f, v in features.items())
        assert predicted == pytest.approx(seconds[kind], rel=1e-9, abs=1e-12)
    executor = {s.labels["kind"]: s.value
                for s in fams["slopilot_iteration_executor_seconds"].samples}
    assert executor["decode"] == pytest.approx(seconds["decode"])  # no loop in a twin


def test_datasheet_and_calibrated_models_are_interchangeable_in_the_simulator() -> None:
    scenario = load_scenario("tiny-cpu")
    profile = dataclasses.replace(make_profile(), executor={}, host={"iteration": 0.01})
    summary = simulate(with_profile(scenario, profile), duration_s=5).summary.to_dict()
    assert summary["iterations"] > 0 and summary["busy_ratio"] > 0


def test_every_shipped_scenarios_twin_is_named_as_its_cost_model_names_itself() -> None:
    """Two labels of one twin: ``simulate`` printed ``(H100, tp=1)``, the scenario's
    spelling of the GPU, while the cost model (and docs/twin.md) says ``(H100-SXM, tp=1)``;
    a reader matching a result to the twin that ran could not."""
    from slopilot.engine.sim.scenario import list_scenarios, load_scenario
    from slopilot.engine.sim.twin import cost_model_for, twin_label

    for name in list_scenarios():
        scenario = load_scenario(name)
        assert twin_label(scenario) == cost_model_for(scenario).label, name


@pytest.mark.timeout(60)  # it spun for ever, its memory growing
def test_a_twin_whose_steps_take_no_time_ends_with_an_error_not_a_spin(tmp_path: Path) -> None:
    """A closed loop with no think time follows each answer at the instant it ends: on
    steps that cost nothing the virtual clock never moved and the run never ended. The
    parser refuses such a profile (``test_profile_file``); the simulator must not spin on
    one built in memory either, nor on any cost model that prices steps as no time."""
    from slopilot.engine.sim.cost_model import CostModelError

    path = tmp_path / "sess.yaml"
    path.write_text(
        "name: sess\ngpu: A100\nmodel: tiny-random\nduration_s: 5\nseed: 0\n"
        "workload:\n  type: sessions\n  concurrency: 4\n"
        "  turns: {dist: fixed, value: 3}\n  question_tokens: {dist: fixed, value: 16}\n"
        "  output_tokens: {dist: fixed, value: 4}\n")
    for iteration in (0.0, 1e-300, 1e-12):
        free = make_profile("tiny-random", device="cpu", executor={"iteration": iteration},
                            host={}, kv_gib=0.01)
        scenario = with_profile(load_scenario(path), free)
        with pytest.raises(CostModelError) as err:
            simulate(scenario)
        message = str(err.value)
        assert "virtual clock" in message and "iterations in a row" in message, message
        assert f"calibrated profile {free.source}" in message, message
