"""Scenarios: every shipped one loads and builds; bad files fail with file, field and fix."""

from __future__ import annotations

import itertools
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from slopilot.engine.config import EngineConfig
from slopilot.engine.request import Priority
from slopilot.engine.sim import profiles
from slopilot.engine.sim.scenario import (
    Scenario,
    ScenarioError,
    list_scenarios,
    load_scenario,
    parse_scenario,
)
from slopilot.engine.sim.sessions import SessionWorkload
from slopilot.engine.sim.workload import RequestSpec, Workload

SHIPPED = ["azure-conv-2023", "demo", "demo-torch", "long-context", "mixed-priority",
           "prefill-bursts", "seed-h800x8-deepseek67b", "tiny-cpu"]


def test_list_scenarios() -> None:
    assert list_scenarios() == SHIPPED


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_scenario_loads_and_builds(name: str) -> None:
    scenario = load_scenario(name)
    assert scenario.name == name
    assert scenario.description
    assert isinstance(scenario.engine_config(), EngineConfig)
    # The cost model can find its hardware and model.
    profiles.get_gpu(scenario.gpu)
    profiles.get_model(scenario.model)
    workload = scenario.build_workload()
    assert isinstance(workload, Workload)
    specs = list(itertools.islice(workload.initial(), 50))
    assert specs
    assert all(0 <= s.arrival_time < scenario.duration_s for s in specs)


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_scenario_fits_its_models_context(name: str) -> None:
    # The twin refuses what the model's context cannot hold, as the server does: a
    # scenario whose requests are longer than its model's context measures refusals.
    # long-context sent 8k-32k prompts to Llama-3-70B (8,192 tokens): every one refused.
    scenario = load_scenario(name)
    context = profiles.get_model(scenario.model).max_position_embeddings
    specs = list(itertools.islice(scenario.build_workload().initial(), 2000))
    too_long = [s for s in specs if s.num_prompt_tokens + s.max_tokens > context]
    assert len(too_long) <= len(specs) // 100, (name, context, len(too_long), len(specs))


def test_the_seed_scenario_is_what_its_name_says() -> None:
    s = load_scenario("seed-h800x8-deepseek67b")
    assert (s.gpu, s.num_gpus, s.tp, s.model, s.duration_s) == ("H800", 8, 8, "deepseek-67b",
                                                                1800)
    workload = s.build_workload()
    assert isinstance(workload, SessionWorkload)
    assert len(list(workload.initial())) == 120
    assert workload.phases[0].long_context_fraction == 0.05
    assert {spec.priority for spec in workload.initial()} == {Priority.P1}


def test_tiny_cpu_shifts_to_longer_prompts_and_more_p0_half_way() -> None:
    s = load_scenario("tiny-cpu")
    specs = list(s.build_workload(seed=3).initial())
    before = [x for x in specs if x.arrival_time < 30]
    after = [x for x in specs if x.arrival_time >= 30]
    def mean_prompt(xs: list[RequestSpec]) -> float:
        return sum(x.num_prompt_tokens for x in xs) / len(xs)

    def p0_share(xs: list[RequestSpec]) -> float:
        return sum(x.priority == Priority.P0 for x in xs) / len(xs)

    assert mean_prompt(after) > 2.5 * mean_prompt(before)
    assert p0_share(after) > p0_share(before)


def test_build_workload_overrides_seed_and_duration() -> None:
    s = load_scenario("mixed-priority")
    short = list(s.build_workload(duration_s=20).initial())
    assert short and max(x.arrival_time for x in short) < 20
    assert short == list(s.build_workload(duration_s=20).initial())
    assert short != list(s.build_workload(duration_s=20, seed=1).initial())


def test_slo_defaults_and_best_effort() -> None:
    s = load_scenario("mixed-priority")
    assert s.slo.class_slo(Priority.P0).ttft_p99_ms == 100
    assert s.slo.class_slo(Priority.P0).tbt_p99_ms == 20
    assert s.slo.class_slo(Priority.P2).best_effort
    assert s.slo.max_preemptions_per_min == 10


def test_repo_scenarios_folder_points_at_the_packaged_copy() -> None:
    readme = Path(__file__).parents[3] / "scenarios" / "README.md"
    assert "slopilot/data/scenarios" in readme.read_text()


# -- user errors -----------------------------------------------------------------------

BASE = textwrap.dedent("""\
    name: mine
    gpu: H100
    model: llama-3-8b
    duration_s: 10
    workload:
      type: open_loop
      arrivals: {process: poisson, rate: 2}
      prompt_tokens: {dist: lognormal, mean: 100, sigma: 0.5}
      output_tokens: 16
    """)


def load_text(tmp_path: Path, text: str) -> Scenario:
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    return load_scenario(path)


def test_a_minimal_file_loads_with_defaults(tmp_path: Path) -> None:
    s = load_text(tmp_path, BASE)
    assert (s.num_gpus, s.tp, s.seed, s.replicas) == (1, 1, 0, 1)
    assert s.source.endswith("mine.yaml")
    assert len(list(s.build_workload().initial())) > 5


@pytest.mark.parametrize("edit, match", [
    (("duration_s: 10", "duraton_s: 10"),
     r"duration_s is required but missing; add it \(is 'duraton_s' a typo for it\?\)"),
    (("name: mine", "name: mine\ndescripton: x"),
     r"descripton: unknown key; did you mean 'description'\?"),
    (("rate: 2}", "rat: 2}"), r"workload\.arrivals\.rate is required.*'rat' a typo"),
    (("rate: 2}", "rate: 2, burst: 3}"), r"workload\.arrivals\.burst: unknown key"),
    (("rate: 2}", "rate: -2}"), r"workload\.arrivals\.rate=-2: must be greater than 0"),
    (("poisson", "poison"), r"process='poison': not allowed; did you mean 'poisson'"),
    (("lognormal", "normal"), r"prompt_tokens\.dist='normal'"),
    (("sigma: 0.5", "sigma: 9"), r"prompt_tokens\.sigma=9: must be at most 5"),
    (("sigma: 0.5", "sigma: '0.5'"), r"sigma='0.5': expected a finite number"),
    (("output_tokens: 16", "output_tokens: -1"), r"output_tokens=-1: must be at least 0"),
    (("type: open_loop", "type: closed"), r"workload\.type='closed'"),
    (("model: llama-3-8b", "model: ''"), r"model='': expected a non-empty string"),
    (("gpu: H100\n", "gpu: H100\nnum_gpus: 6\ntp: 4\n"), r"tp=4: num_gpus=6 is not a multiple"),
    (("gpu: H100\n", "gpu: H100\nseed: -1\n"), r"seed=-1: must be at least 0"),
    # checked on load, with the file and the field (it failed only when the simulator
    # started, as "unknown GPU 'H1000'" with neither, and offered a YAML file it refuses)
    (("gpu: H100\n", "gpu: H1000\n"),
     r"mine\.yaml: gpu='H1000': unknown GPU 'H1000'; known GPUs: .*H100-SXM.*; or one of "
     r"their short names: .*h100"),
    (("model: llama-3-8b", "model: llama-3-9b"),
     r"mine\.yaml: model='llama-3-9b': unknown model 'llama-3-9b'; known models: "),
    (("gpu: H100\n", "gpu: H100\nengine: {token_budget: 99999}\n"),
     r"mine\.yaml: engine: token_budget=99999 is out of range"),
    (("gpu: H100\n", "gpu: H100\nengine: {budget: 512}\n"), r"engine: unknown knob 'budget'"),
    (("gpu: H100\n", "gpu: H100\ngpu_memory_utilization: 1.5\n"),
     r"gpu_memory_utilization=1\.5: must be at most 1"),
    (("gpu: H100\n", "gpu: H100\nslo: {classes: {p1: {ttft_p99: 5}}}\n"),
     r"slo\.classes\.p1\.ttft_p99: unknown objective"),
    (("gpu: H100\n", "gpu: H100\nslo: {classes: {p1: {tbt_p99_ms: 0}}}\n"),
     r"slo\.classes\.p1\.tbt_p99_ms=0: expected a positive number"),
    (("gpu: H100\n", "gpu: H100\nslo: {p1: {tbt_p99_ms: 5}}\n"),
     r"slo: unknown SLO field\(s\) 'p1'"),
    (("output_tokens: 16", "output_tokens: 16\n  classes: {p0: 0, p1: 0}"),
     r"workload\.classes: all weights are 0"),
    (("output_tokens: 16", "output_tokens: 16\n  classes: {p3: 1}"),
     r"workload\.classes\.p3: unknown key"),
    (("output_tokens: 16", "output_tokens: 16\n  shift: {at_s: 20, rate: 3}"),
     r"workload\.shift\.rate: unknown key"),
    (("output_tokens: 16", "output_tokens: 16\n  shift: {at_s: 0}"),
     r"workload\.shift\.at_s=0: must be greater than 0"),
    (("output_tokens: 16", "output_tokens: 16\n  shift: [{at_s: 5}, {at_s: 4}]"),
     r"workload\.shift\[1\]\.at_s=4\.0: must be later than the previous phase's start"),
    (("{dist: lognormal, mean: 100, sigma: 0.5}", "{dist: uniform, low: 50, high: 10}"),
     r"workload\.prompt_tokens: high=10\.0: must be a finite number >= low=50"),
])
def test_bad_fields_name_file_field_value_and_fix(tmp_path: Path, edit: tuple[str, str],
                                                 match: str) -> None:
    old, new = edit
    assert old in BASE
    with pytest.raises(ScenarioError, match=match) as info:
        load_text(tmp_path, BASE.replace(old, new, 1))
    assert "mine.yaml" in str(info.value)


@pytest.mark.parametrize(("edit", "listed"), [
    (("name: mine", "name: mine\nzzzqq: 1"), "duration_s"),  # no close match
    (("name: mine", "name: mine\ndescripton: x"), "duration_s"),
    (("poisson", "qqqq"), "on_off"),
    (("poisson", "poison"), "on_off"),
])
def test_the_allowed_keys_and_values_are_listed_once(tmp_path: Path, edit: tuple[str, str],
                                                      listed: str) -> None:
    # An unknown key printed them twice: "known: ..." and again "(allowed here: ...)".
    with pytest.raises(ScenarioError) as info:
        load_text(tmp_path, BASE.replace(*edit, 1))
    assert str(info.value).count(listed) == 1, str(info.value)


@pytest.mark.parametrize(("slo", "message"), [
    ("{classes: {p0: {ttft_p99_ms: -3}, p1: {tbt_p99_ms: 150}}}",
     "mine.yaml: slo.classes.p0.ttft_p99_ms=-3: expected a positive number, or null for best "
     "effort"),
    ("{profile: standard, classes: {p0: {ttfp_p99_ms: 3}}}",
     "mine.yaml: slo.classes.p0.ttfp_p99_ms: unknown objective (did you mean "
     "ttft_p99_ms?); use one of: "),
    ("{profile: fast, classes: {p0: {ttft_p99_ms: 3}}}",
     "mine.yaml: slo.profile='fast': unknown SLO profile; use one of: strict, standard, "
     "relaxed"),
    ("{max_preemptions_per_min: 0, classes: {p1: {tbt_p99_ms: 150}}}",
     "mine.yaml: slo.max_preemptions_per_min=0: expected a positive number"),
    ("{classes: [p0], profile: standard}",
     "mine.yaml: slo.classes: expected a mapping of p0/p1/p2 to objectives"),
    ("{tbt: 5, profile: standard}", "mine.yaml: slo: unknown SLO field(s) 'tbt'; known "),
    ("5", "mine.yaml: slo=5: expected a mapping of profile, classes, "),
])
def test_a_bad_slo_names_the_field_path_value_and_fix_not_the_whole_mapping(
        tmp_path: Path, slo: str, message: str) -> None:
    # It quoted the whole mapping first: "slo={'classes': {'p0': {...: classes.p0...".
    with pytest.raises(ScenarioError) as info:
        load_text(tmp_path, f"{BASE}slo: {slo}\n")
    assert str(info.value).startswith(str(tmp_path / "mine.yaml") + ": ")
    assert message in str(info.value)
    assert "{" not in str(info.value)


def test_malformed_yaml_is_reported_with_the_file(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match=r"mine\.yaml: not valid YAML"):
        load_text(tmp_path, "name: [unclosed\n")
    with pytest.raises(ScenarioError, match=r"the document must be a mapping"):
        load_text(tmp_path, "- just\n- a list\n")


@pytest.mark.parametrize("text", ["", "\n", "# only a comment\n"])
def test_an_empty_file_says_so_and_what_a_scenario_needs(tmp_path: Path, text: str) -> None:
    # It said "the document must be a mapping of key: value, got nothing None".
    with pytest.raises(ScenarioError) as info:
        load_text(tmp_path, text)
    message = str(info.value)
    assert "mine.yaml: the file is empty" in message
    assert "name, gpu, model, duration_s and workload" in message
    assert "None" not in message


def test_a_section_left_empty_is_named_without_none(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match=r"workload must be a mapping of key: value, "
                                            r"got nothing$"):
        load_text(tmp_path, BASE[:BASE.index("workload:")] + "workload:\n")


def test_unknown_names_suggest_the_shipped_ones() -> None:
    with pytest.raises(ScenarioError, match="did you mean 'tiny-cpu'"):
        load_scenario("tiny-gpu")
    with pytest.raises(ScenarioError) as info:
        load_scenario("zzzqq")
    assert str(info.value).count("mixed-priority") == 1
    with pytest.raises(ScenarioError, match="does not exist"):
        load_scenario("no/such/file.yaml")


def test_sessions_and_shifts_inherit_unnamed_fields(tmp_path: Path) -> None:
    s = load_text(tmp_path, BASE.replace(BASE[BASE.index("workload:"):], textwrap.dedent("""\
        workload:
          type: sessions
          concurrency: 3
          turns: {dist: uniform, low: 2, high: 4}
          question_tokens: 50
          output_tokens: 10
          think_time_s: {dist: lognormal, mean: 2, sigma: 0.3}
          long_context: {fraction: 0.5, tokens: 300}
          shift: {at_s: 5, concurrency: 6, question_tokens: 80}
        """)))
    workload = s.build_workload()
    assert isinstance(workload, SessionWorkload)
    first, second = workload.phases
    assert (first.concurrency, second.concurrency) == (3, 6)
    assert second.turns == first.turns and second.long_context_fraction == 0.5
    assert second.question_tokens.nominal_mean == 80


def test_trace_workload_with_a_relative_path_and_empirical_lengths(tmp_path: Path) -> None:
    (tmp_path / "t.jsonl").write_text(
        "".join(f'{{"arrival_time": {i}, "prompt_tokens": {10 + i}, "output_tokens": 3}}\n'
                for i in range(20)))
    doc = yaml.safe_load(BASE)
    doc["workload"] = {"type": "trace", "trace": "t.jsonl", "target_rate": 2.0,
                       "max_requests": 10}
    s = parse_scenario(doc, source="doc", base_dir=tmp_path)
    specs = list(s.build_workload().initial())
    assert len(specs) == 10 and specs[-1].arrival_time == pytest.approx(4.5)
    doc["workload"] = {"type": "open_loop", "arrivals": {"process": "poisson", "rate": 5},
                       "prompt_tokens": {"dist": "empirical", "trace": "t.jsonl",
                                         "field": "prompt_tokens"},
                       "output_tokens": 4}
    specs = list(parse_scenario(doc, base_dir=tmp_path).build_workload().initial())
    assert {x.num_prompt_tokens for x in specs} <= set(range(10, 30))
    doc["workload"]["prompt_tokens"]["trace"] = "missing.jsonl"
    with pytest.raises(ScenarioError, match=r"prompt_tokens\.trace='missing\.jsonl': no such"):
        parse_scenario(doc, base_dir=tmp_path)


def test_a_malformed_trace_fails_at_load_not_mid_run(tmp_path: Path) -> None:
    (tmp_path / "t.jsonl").write_text('{"arrival_time": 0, "prompt_tokens": 5}\n')
    doc = yaml.safe_load(BASE)
    doc["workload"] = {"type": "trace", "trace": "t.jsonl"}
    with pytest.raises(ScenarioError, match=r"t\.jsonl:1: missing output_tokens"):
        parse_scenario(doc, source="doc", base_dir=tmp_path)
    doc["workload"] = {"type": "trace", "trace": "azure-llm-2023-conv", "time_scale": 1,
                       "target_rate": 3}
    with pytest.raises(ScenarioError, match="not both"):
        parse_scenario(doc, source="doc")


@pytest.mark.parametrize("field", ["engine: {preemption_mode: *a5}",
                                   "slo: {max_preemptions_per_min: *a5}"])
def test_an_alias_bomb_is_refused_before_a_message_quotes_it(tmp_path: Path,
                                                             field: str) -> None:
    # A knob's or the SLO's error quoted the value whole: 9**6 aliased strings made a
    # megabytes-long message (9**9 took minutes and gigabytes to build).
    lines = ["bombs:", "  a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"  a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 6)]
    with pytest.raises(ScenarioError, match=r"mine\.yaml: not valid YAML: its aliases") as info:
        load_text(tmp_path, "\n".join(lines) + "\n" + BASE + field + "\n")
    assert len(str(info.value)) < 400


def test_a_scenario_nested_past_the_parsers_depth_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match=r"mine\.yaml: not valid YAML: nested deeper"):
        load_text(tmp_path, BASE + "engine: " + "[" * 5000 + "]" * 5000 + "\n")


def test_a_scenario_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    # Saved as Latin-1: the decoder's own message named neither the file nor a fix.
    path = tmp_path / "mine.yaml"
    path.write_bytes(BASE.replace("name: mine", "name: caf\xe9").encode("latin-1"))
    with pytest.raises(ScenarioError, match=r"mine\.yaml: cannot read the scenario: 'utf-8' "
                                            r"codec can't decode .*save it as UTF-8"):
        load_scenario(path)


@pytest.mark.timeout(30)
def test_a_pipe_named_as_a_scenario_is_refused_unread(tmp_path: Path) -> None:
    # It said "does not exist" of a FIFO; and a scenario was read with no bound at all.
    import os

    os.mkfifo(tmp_path / "s.yaml")
    with pytest.raises(ScenarioError, match=r"s\.yaml: cannot read the scenario: is a named "
                                            r"pipe \(FIFO\), not a regular file"):
        load_scenario(tmp_path / "s.yaml")
    (tmp_path / "big.yaml").write_text("# x\n" * 300_000)
    with pytest.raises(ScenarioError, match=r"big\.yaml: 1,200,000 bytes, past the "
                                            r"1,048,576 bytes read: no scenario is that"):
        load_scenario(tmp_path / "big.yaml")


def test_a_folder_named_as_a_scenario_is_called_a_folder(tmp_path: Path) -> None:
    folder = tmp_path / "scenarios.yaml"
    folder.mkdir()
    with pytest.raises(ScenarioError, match=r"is a folder, not a scenario file; name a \.yaml"):
        load_scenario(str(folder))


def test_a_bare_folder_name_is_called_a_folder_as_its_path_is(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `--scenario adir` said "unknown scenario 'adir'" while `--scenario ./adir` said it
    # is a folder.
    (tmp_path / "adir").mkdir()
    monkeypatch.chdir(tmp_path)
    for given in ("adir", "./adir"):
        with pytest.raises(ScenarioError,
                           match=rf"scenario file '{re.escape(given)}' is a folder, not a "
                                 r"scenario file; name a \.yaml"):
            load_scenario(given)
    (tmp_path / "tiny-cpu").mkdir()  # a shipped name is the shipped scenario still
    assert load_scenario("tiny-cpu").name == "tiny-cpu"


@pytest.mark.parametrize(("edit", "read"), [
    # PyYAML reads YAML 1.1, where a float needs a dot and a signed exponent: `1e7` was
    # the string '1e7', refused as "expected a finite number" where a user meant 10**7.
    (("rate: 2}", "rate: 1e7}"), lambda s: s.workload.phases[0].arrivals.rate == 1e7),
    (("rate: 2}", "rate: 2.5E+1}"), lambda s: s.workload.phases[0].arrivals.rate == 25.0),
    (("duration_s: 10", "duration_s: 6e1"), lambda s: s.duration_s == 60.0),
    (("gpu: H100\n", "gpu: H100\nseed: 1e3\n"), lambda s: s.seed == 1000),
    (("output_tokens: 16", "output_tokens: 16\n  classes: {p0: 1e-1, p1: 9e-1}"),
     lambda s: s.workload.phases[0].classes.weights == (0.1, 0.9, 0.0)),
])
def test_a_number_in_scientific_notation_is_the_number_meant(
        tmp_path: Path, edit: tuple[str, str], read: Any) -> None:
    old, new = edit
    assert old in BASE
    assert read(load_text(tmp_path, BASE.replace(old, new, 1)))


@pytest.mark.parametrize(("edit", "match"), [
    # The same checks as any number: finite, within its bounds.
    (("rate: 2}", "rate: 1e999}"), r"workload\.arrivals\.rate=inf: expected a finite number"),
    (("rate: 2}", "rate: -1e3}"), r"workload\.arrivals\.rate=-1000\.0: must be greater than 0"),
    (("gpu: H100\n", "gpu: H100\nseed: 1.5e0\n"), r"seed=1\.5: expected a whole number"),
    # Quoted, it is the text the user wrote, as '0.5' is: refused, saying how to write it.
    (("rate: 2}", "rate: '1e7'}"), r"rate='1e7': expected a finite number; write it "
                                   r"without quotes"),
])
def test_scientific_notation_is_checked_as_any_number(tmp_path: Path, edit: tuple[str, str],
                                                      match: str) -> None:
    old, new = edit
    with pytest.raises(ScenarioError, match=match):
        load_text(tmp_path, BASE.replace(old, new, 1))


def test_other_yaml_keeps_an_exponent_like_string_a_string() -> None:
    # A cost profile's hashes are hex: one like 8e12345 is text, as PyYAML's dumper wrote it.
    from slopilot.engine.sim.yaml_load import safe_load_bounded

    assert safe_load_bounded("hash: 8e12") == {"hash": "8e12"}
    assert safe_load_bounded("hash: 8e12", exponents=True) == {"hash": 8e12}


def test_a_key_given_twice_is_refused_with_the_file_and_lines(tmp_path: Path) -> None:
    # duration_s: 10 with `duration_s: 5` appended ran 5 s, silently.
    with pytest.raises(ScenarioError) as err:
        load_text(tmp_path, BASE + "duration_s: 5\n")
    message = str(err.value)
    assert message.startswith(f"{tmp_path / 'mine.yaml'}: duration_s given twice (line 4, "
                              "then line 10)"), message
    assert "not valid YAML" not in message
