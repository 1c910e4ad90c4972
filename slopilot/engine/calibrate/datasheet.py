"""A scenario's datasheet roofline in the calibrated form, so that it can be checked and
corrected like a calibrated profile.

The live correction (``engine/sim/correction.py``) moves the coefficients of the linear
calibrated form; the datasheet roofline (``sim/cost_model.py``) has none. Timed on the
calibration grid (``design.py``) and fitted by ``fit.py`` exactly as ``slopilot
calibrate`` fits a real executor, it gets them.
"""

from __future__ import annotations

import functools
from types import MappingProxyType

from slopilot.engine.calibrate.design import GridOptions, design
from slopilot.engine.calibrate.fit import Observation, fit_shapes
from slopilot.engine.sim.cost_model import CostModel
from slopilot.engine.sim.profile_file import CostProfile, DeviceInfo, FitReport
from slopilot.engine.sim.scenario import Scenario


def datasheet_profile(scenario: Scenario, gpu_memory_utilization: float | None = None
                      ) -> CostProfile:
    """``scenario``'s datasheet roofline, fitted on the calibration grid; its KV cache
    as the scenario's (``gpu_memory_utilization``, default the scenario's or 0.9)."""
    return _fitted(scenario.gpu, scenario.model, scenario.tp,
                   gpu_memory_utilization or scenario.gpu_memory_utilization or 0.9)


@functools.lru_cache(maxsize=16)
def _fitted(gpu: str, model: str, tp: int, gpu_memory_utilization: float) -> CostProfile:
    # Cached: the fit takes a fraction of a second, and the loop asks on every check.
    roofline = CostModel(gpu, model, tp)
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
        tp=tp, kv_cache_bytes=blocks * 16 * roofline.kv_bytes_per_token(),
        fit=FitReport(repeats=1, shapes=len(obs), mape=fit.mape, max_err=fit.max_err,
                      token_budget=grid.token_budget, max_num_seqs=grid.max_num_seqs,
                      max_context=grid.max_context),
        source=f"datasheet roofline ({roofline.gpu.name}) fitted to the calibrated form")
