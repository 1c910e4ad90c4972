"""The closed loop's twin and plants: cost profiles built in code from the profile types.

The controller can only correct a twin on the linear calibrated form (its coefficients
are what ``correction.refit`` moves), so the twin here is **the datasheet roofline in the
calibrated form**: the A100 / Llama-3-8B roofline (``sim/cost_model.py``) timed on the
calibration grid (``calibrate/design.py``) and fitted by ``calibrate/fit.py`` exactly as
``slopilot calibrate`` fits a real executor. The plants are that profile, changed:

- ``same``: the twin itself (the twin right by construction: today's closed loop);
- ``attention``: every attention term (the features that count KV tokens read or
  attention pairs) 1.5x costlier and the per-iteration overhead 2x, host and executor;
- ``cpu``: the form ``slopilot calibrate`` found on this CPU's torch executor (docs/twin.md,
  "How the form was found") put on the datasheet's magnitudes: prefill attention on the
  dense score matrix (the causal coefficient moved to ``prefill_attention_dense``, so a
  fresh chunk costs twice its causal pairs), decode attention padded to the longest row
  (``decode_context`` moved to ``decode_padded_context``), one attention call per prefill
  chunk and per decode batch at the CPU's ratio to the forward pass (0.15 and 0.1 of
  ``iteration``), weights and compute not overlapped (``tokens`` 1.3x), and a cold first
  iteration after idling (``idle_starts`` = 2 x ``iteration``).

None is a calibration of real hardware; each is a stated change of a stated profile.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from types import MappingProxyType

from slopilot.engine.calibrate.design import GridOptions, design
from slopilot.engine.calibrate.fit import Observation, fit_shapes
from slopilot.engine.sim.cost_model import CostModel
from slopilot.engine.sim.profile_file import CostProfile, DeviceInfo, FitReport
from slopilot.engine.sim.scenario import Scenario

ATTENTION = ("decode_context", "decode_padded_context", "prefill_context",
             "prefill_attention", "prefill_attention_dense")


def datasheet_profile(scenario: Scenario, gpu_memory_utilization: float = 0.9
                      ) -> CostProfile:
    """``scenario``'s datasheet roofline, fitted on the calibration grid."""
    roofline = CostModel(scenario.gpu, scenario.model, scenario.tp)
    grid = GridOptions(token_budget=4096, max_num_seqs=64, max_context=8192, swap=False)
    obs = [Observation(spec.shape, roofline.iteration_time([(n, c) for n, c, _ in spec.rows]),
                       spec.describe(), spec.group) for spec in design(grid) if spec.rows]
    fit = fit_shapes(obs)
    coef = dict(fit.coefficients)
    coef["swap_blocks"] = roofline.swap_time_per_block(16)
    coef["swap_batches"] = roofline.swap_latency_s
    coef["idle_starts"] = 0.0
    blocks = roofline.num_kv_blocks(16, gpu_memory_utilization)
    return CostProfile(
        name=f"{roofline.label} in the calibrated form",
        device=DeviceInfo("cuda", roofline.gpu.name), model=roofline.model,
        dtype="bfloat16", executor=MappingProxyType(coef), host=MappingProxyType({}),
        tp=scenario.tp, kv_cache_bytes=blocks * 16 * roofline.kv_bytes_per_token(),
        fit=FitReport(repeats=1, shapes=len(obs), mape=fit.mape, max_err=fit.max_err,
                      token_budget=grid.token_budget, max_num_seqs=grid.max_num_seqs,
                      max_context=grid.max_context),
        source=f"datasheet roofline ({roofline.gpu.name}) fitted to the calibrated form")


def _changed(p: CostProfile, name: str, change: Callable[[dict[str, float]], None]
             ) -> CostProfile:
    executor = dict(p.executor)
    change(executor)
    host = {k: v for k, v in p.host.items()}
    return dataclasses.replace(p, executor=MappingProxyType(executor),
                               host=MappingProxyType(host), name=f"{p.name}, {name}",
                               source=f"plant: {name}")


def attention_plant(p: CostProfile) -> CostProfile:
    def change(c: dict[str, float]) -> None:
        for k in ATTENTION:
            c[k] = c.get(k, 0.0) * 1.5
        c["iteration"] = c.get("iteration", 0.0) * 2.0
    return _changed(p, "attention 1.5x, per-iteration overhead 2x", change)


def cpu_plant(p: CostProfile) -> CostProfile:
    def change(c: dict[str, float]) -> None:
        it = c.get("iteration", 0.0)
        c["prefill_attention_dense"] = c.get("prefill_attention_dense", 0.0) \
            + c.pop("prefill_attention", 0.0)
        c["decode_padded_context"] = c.get("decode_padded_context", 0.0) \
            + c.pop("decode_context", 0.0)
        c["prefill_seqs"] = c.get("prefill_seqs", 0.0) + 0.15 * it
        c["decode_batches"] = c.get("decode_batches", 0.0) + 0.1 * it
        c["tokens"] = c.get("tokens", 0.0) * 1.3
        c["idle_starts"] = 2.0 * it
    return _changed(p, "CPU-calibrated form on the datasheet's magnitudes", change)


PLANTS: Mapping[str, Callable[[CostProfile], CostProfile]] = MappingProxyType({
    "same": lambda p: p, "attention": attention_plant, "cpu": cpu_plant})
