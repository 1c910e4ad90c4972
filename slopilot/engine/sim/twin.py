"""Which cost model a scenario's twin runs on, and what every output says about it.

A scenario's hardware is either a datasheet GPU (``gpu: H100``: the roofline of
``cost_model.py``, uncalibrated) or a calibrated profile (``profile: FILE`` in the
scenario, or ``--profile FILE`` on ``simulate``, ``tune`` and ``demo``: the measured
model of ``calibrated.py``). ``cost_model_for`` builds the one a scenario names;
``with_profile`` attaches a profile after checking it is for the scenario's model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from slopilot.engine.context_limit import servable_tokens
from slopilot.engine.outputs import SchedulerOutput
from slopilot.engine.sim.profile_file import (
    CostProfile,
    ProfileFileError,
    check_profile_for,
    load_profile,
)
from slopilot.engine.sim.profiles import ModelProfile
from slopilot.engine.sim.scenario import Scenario


class IterationCostModel(Protocol):
    """What the simulated executor and the simulator need from a cost model."""

    model: ModelProfile
    tp: int
    calibrated: bool
    decode_knee_tokens: int | None  # the knee of the decode_spill feature, if any
    graph_batch: int | None  # the bound of the eager_passes feature: graphs, if any

    @property
    def label(self) -> str: ...
    @property
    def device_name(self) -> str: ...
    def output_time(self, out: SchedulerOutput, block_size: int = 16) -> float: ...
    def iteration_time(self, batch: list[tuple[int, int]]) -> float: ...
    def swap_time_per_block(self, block_size: int) -> float: ...
    def swap_time(self, num_blocks: int, block_size: int) -> float: ...
    def num_kv_blocks(self, block_size: int, gpu_memory_utilization: float = 0.9) -> int: ...
    def num_cpu_blocks(self, block_size: int, swap_space_gb: float) -> int: ...


def cost_model_for(scenario: Scenario) -> IterationCostModel:
    """The scenario's calibrated profile if it names one, else its datasheet roofline."""
    if scenario.profile is not None:
        from slopilot.engine.sim.calibrated import CalibratedCostModel
        return CalibratedCostModel(scenario.profile)
    from slopilot.engine.sim.cost_model import CostModel
    return CostModel(scenario.gpu, scenario.model, scenario.tp)


def kv_tokens_for(scenario: Scenario, config: Mapping[str, Any] | None = None) -> int:
    """The tokens one replica's KV cache of ``scenario`` holds with knob overrides
    ``config``, as ``simulator.build_engine`` sizes it."""
    engine = scenario.engine_config().with_overrides(config or {})
    util = scenario.gpu_memory_utilization or 0.9
    return cost_model_for(scenario).num_kv_blocks(engine.block_size, util) \
        * engine.block_size


def kv_admits_tokens_for(scenario: Scenario, config: Mapping[str, Any] | None = None) -> int:
    """The KV tokens one replica of ``scenario`` holds before it admits no new request
    (knob overrides ``config``): its cache less the ``kv_watermark`` share of its blocks
    that admission keeps free while any request runs (``engine/admission.py``)."""
    engine = scenario.engine_config().with_overrides(config or {})
    blocks = kv_tokens_for(scenario, config) // engine.block_size
    return (blocks - int(engine.kv_watermark * blocks)) * engine.block_size


def servable_tokens_for(scenario: Scenario, config: Mapping[str, Any] | None = None) -> int:
    """The most prompt plus output tokens one replica of ``scenario`` serves with knob
    overrides ``config``: the model's context, at most its KV cache, as
    ``simulator.build_engine`` sizes them (``context_limit``: the twin refuses a longer
    request on arrival, as the server does, and no latency counts it)."""
    return servable_tokens(cost_model_for(scenario).model.max_position_embeddings,
                           kv_tokens_for(scenario, config))


def twin_label(scenario: Scenario) -> str:
    """``calibrated profile FILE`` or ``uncalibrated datasheet roofline (GPU, tp=N)``: the
    label of the cost model the scenario runs on, named as that model names itself (the
    GPU's datasheet name, not the scenario's alias for it)."""
    return cost_model_for(scenario).label


def with_profile(scenario: Scenario, profile: CostProfile | str | Path) -> Scenario:
    """``scenario`` on ``profile``'s hardware; refuses a profile for another model or TP."""
    p = profile if isinstance(profile, CostProfile) else load_profile(profile, warn=False)
    try:
        check_profile_for(p, model=scenario.model, tp=scenario.tp)
    except ProfileFileError as exc:
        raise ProfileFileError(f"scenario {scenario.name}: {exc}") from None
    return dataclasses.replace(scenario, profile=p, gpu=p.device.name)
