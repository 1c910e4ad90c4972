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

from slopilot.engine.calibrate.datasheet import datasheet_profile
from slopilot.engine.sim.profile_file import CostProfile

__all__ = ["PLANTS", "datasheet_profile"]

ATTENTION = ("decode_context", "decode_padded_context", "decode_spill", "prefill_context",
             "prefill_attention", "prefill_attention_dense")


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
