"""EngineConfig: every knob bounded, errors that name the value and the fix."""

from __future__ import annotations

import dataclasses

import pytest

from slopilot.engine.config import (
    PRESETS,
    ConfigError,
    EngineConfig,
    PreemptionMode,
    knobs_from_json,
    parse_set_args,
    preset,
)


def test_defaults_match_the_design_table() -> None:
    cfg = EngineConfig()
    assert (cfg.token_budget, cfg.budget_align, cfg.chunk_size, cfg.max_num_seqs) == \
        (1024, 256, 512, 256)
    assert cfg.preemption_mode is PreemptionMode.AUTO
    assert (cfg.recompute_max_tokens, cfg.max_preemptions_per_step) == (512, 2)
    assert (cfg.swap_timeout_ms, cfg.p0_preempt_utilization, cfg.kv_watermark) == \
        (50.0, 0.9, 0.05)
    assert (cfg.block_size, cfg.swap_space_gb) == (16, 32.0)


@pytest.mark.parametrize(("knob", "value", "message"), [
    ("token_budget", 127, r"token_budget=127 is out of range; use a value in \[128, 16384\]"),
    ("token_budget", 20000, r"\[128, 16384\]"),
    ("chunk_size", 32, r"chunk_size=32 is out of range; use a value in \[64, 16384\]"),
    ("budget_align", 100, r"budget_align=100 is not allowed; use one of: 1, 64, 128, 256"),
    ("max_num_seqs", 0, r"max_num_seqs=0"),
    ("preemption_mode", "sometimes", r"recompute, swap, auto"),
    ("kv_watermark", 0.6, r"kv_watermark=0.6 is out of range; use a value in \[0.0, 0.5\]"),
    ("p0_preempt_utilization", float("nan"), r"expected a finite number"),
    ("block_size", 4, r"block_size=4"),
    ("max_preemptions_per_step", 1.5, r"expected an integer"),
    ("max_preemptions_per_step", True, r"expected an integer"),
    ("enable_prefix_caching", "maybe", r"expected true or false"),
])
def test_bad_values_name_the_knob_and_the_range(knob: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        EngineConfig().with_overrides({knob: value})
    # The knob travels as data, so callers (the admin API, the operator) never parse text.
    assert info.value.field == knob and info.value.fields == (knob,)


def test_chunk_above_budget_is_refused_with_the_fix() -> None:
    with pytest.raises(ConfigError, match="lower chunk_size or raise token_budget") as info:
        EngineConfig(token_budget=512, chunk_size=1024)
    assert info.value.field == "chunk_size"
    assert info.value.fields == ("chunk_size", "token_budget")  # a cross-field rule
    # Alignment counts: 300 rounds up to 512, which holds a 500-token chunk.
    assert EngineConfig(token_budget=300, chunk_size=500).effective_budget == 512


def test_a_budget_rounded_up_is_named_as_given_and_as_rounded() -> None:
    # PUT {"token_budget": 128} over a running chunk of 512 read "exceeds the token
    # budget 256": neither number the client sent.
    with pytest.raises(ConfigError) as info:
        EngineConfig(token_budget=128, budget_align=256, chunk_size=512)
    assert str(info.value) == ("chunk_size=512 exceeds the token budget 256 "
                               "(token_budget=128 rounded up to budget_align=256); lower "
                               "chunk_size or raise token_budget")


def test_unknown_knob_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown knob .tokens.; known knobs: .*token_budget") \
            as info:
        EngineConfig().with_overrides({"tokens": 5})
    assert info.value.field == "tokens"


def test_strings_from_the_command_line_are_coerced() -> None:
    cfg = EngineConfig().with_overrides(parse_set_args(
        ["token_budget=2048", "chunk_size=1024", "preemption_mode=swap",
         "kv_watermark=0.1", "enable_prefix_caching=off"]))
    assert cfg.token_budget == 2048 and cfg.preemption_mode is PreemptionMode.SWAP
    assert cfg.kv_watermark == 0.1 and cfg.enable_prefix_caching is False
    with pytest.raises(ConfigError, match="expected knob=value"):
        parse_set_args(["token_budget"])
    with pytest.raises(ConfigError, match="token_budget='lots': expected a whole number"):
        EngineConfig().with_overrides({"token_budget": "lots"})


@pytest.mark.parametrize(("item", "message"), [
    # Python's int() and float() take underscores and any script's digits: "5_12" ran as
    # 512 and "١٠٢٤" (Arabic-Indic) as 1024, neither what a knob's text is.
    ("token_budget=5_12", "token_budget='5_12': expected a whole number"),
    ("token_budget=١٠٢٤", "token_budget='١٠٢٤': expected a whole number"),
    ("kv_watermark=0_1", "kv_watermark='0_1': expected a number"),
    ("kv_watermark=٠.١", "kv_watermark='٠.١': expected a number"),
    ("swap_timeout_ms=nan", "swap_timeout_ms='nan': expected a number"),
])
def test_command_line_numbers_are_ascii_decimals(item: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        EngineConfig().with_overrides(parse_set_args([item]))
    assert info.value.field == item.partition("=")[0]


def test_command_line_numbers_keep_their_ordinary_forms() -> None:
    cfg = EngineConfig().with_overrides(parse_set_args(
        ["token_budget= +512 ", "swap_timeout_ms=1e2", "kv_watermark=.25"]))
    assert (cfg.token_budget, cfg.swap_timeout_ms, cfg.kv_watermark) == (512, 100.0, 0.25)


@pytest.mark.parametrize(("knob", "value", "message"), [
    ("token_budget", "512", r"token_budget='512': expected a whole number as a JSON "
                            r'number, not a string; e.g. \{"token_budget": 512\}'),
    ("token_budget", "5_12", r"token_budget='5_12': expected a whole number as a JSON"),
    ("token_budget", 512.5, r"token_budget=512\.5: expected a whole number"),
    ("token_budget", True, r"token_budget=True: expected a whole number"),
    ("kv_watermark", "0.1", r"kv_watermark='0\.1': expected a number as a JSON number"),
    ("enable_prefix_caching", "on", r"enable_prefix_caching='on': expected true or false "
                                    r"as a JSON boolean"),
    ("enable_prefix_caching", 1, r"enable_prefix_caching=1: expected true or false"),
    ("preemption_mode", 1, r"preemption_mode=1: expected one of recompute, swap, auto as "
                           r"a JSON string"),
])
def test_a_json_knob_is_a_json_value_of_its_type(knob: str, value: object,
                                                  message: str) -> None:
    """The admin API's edge: JSON has numbers and booleans, so a knob is one, not text
    for Python's int() (which read "5_12" as 512)."""
    with pytest.raises(ConfigError, match=message) as info:
        knobs_from_json({knob: value})
    assert info.value.field == knob


def test_a_json_config_reads_back_as_it_was_written() -> None:
    # What the operator PUTs (to_dict) is taken whole; an integral number is that integer.
    cfg = EngineConfig(token_budget=2048, chunk_size=2048)
    assert EngineConfig().with_overrides(knobs_from_json(cfg.to_dict())) == cfg
    knobs = knobs_from_json({"token_budget": 512.0, "no_such_knob": "x"})
    assert knobs == {"token_budget": 512, "no_such_knob": "x"}  # with_overrides names it
    assert type(knobs["token_budget"]) is int


def test_live_only_refuses_knobs_that_need_a_restart() -> None:
    cfg = EngineConfig()
    with pytest.raises(ConfigError, match="block_size cannot change on a running engine") as info:
        cfg.with_overrides({"block_size": 32}, live_only=True)
    assert info.value.field == "block_size"
    # The same value is not a change.
    assert cfg.with_overrides({"block_size": 16}, live_only=True) == cfg


def test_presets_are_the_design_tiers() -> None:
    assert (preset("strict").token_budget, preset("strict").chunk_size) == (512, 256)
    assert (preset("standard").token_budget, preset("standard").chunk_size) == (1024, 512)
    assert (preset("relaxed").token_budget, preset("relaxed").chunk_size) == (2048, 1024)
    assert set(PRESETS) == {"strict", "standard", "relaxed"}
    with pytest.raises(ConfigError, match="unknown preset 'fast'"):
        preset("fast")


def test_config_is_immutable_and_round_trips() -> None:
    cfg = EngineConfig(token_budget=2048, chunk_size=2048)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.token_budget = 1  # type: ignore[misc]
    assert EngineConfig().with_overrides(cfg.to_dict()) == cfg
    assert all(EngineConfig.knob_docs().values())
