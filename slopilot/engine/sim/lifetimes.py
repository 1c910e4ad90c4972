"""How long a trace's requests stay in the engine: what a window's warm-up and drain cover.

A window of a trace starts on the engine its earlier requests left: those in flight at
its start arrived up to one lifetime before it. Its warm-up must reach back that far, or
the window starts on a near-empty KV cache that the whole trace never sees again (a
reasoning trace's requests live minutes: a 30 s warm-up left its windows at a third of
the cache the whole trace fills). Its drain must reach as far after it, or its requests
are cut off before they can be judged.

A request's lifetime, served without queueing, is its prefill plus its output tokens
times the decode step. The step grows with what the KV cache holds, and the requests
that live long are the ones that fill it, so the step used is one over a KV cache full
of the trace's requests (at most ``max_num_seqs`` of them): a bound on the decode step
in the state those requests drive the engine to, from the twin's own cost model, with
no simulation. Queueing is left out on purpose: an engine that queues misses its TTFT
target within the warm-up anyway, and a queue has no lifetime to reach back to.

Which lifetime: the one covering the requests that make up ``LIFETIME_QUANTILE`` of
what the KV cache holds (their token-seconds: lifetime x mean context), not of the
requests counted. A few long requests among many short ones hold most of the cache (one
request in 200 living 400 s outweighs the rest at 3 s each), and a warm-up that misses
them misses the state that decides preemption and admission.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from slopilot.engine.sim.scenario import Scenario
from slopilot.engine.sim.trace import TraceRecord
from slopilot.engine.sim.twin import IterationCostModel, cost_model_for, kv_tokens_for

LIFETIME_QUANTILE = 0.99
"""The share of the KV cache's token-seconds whose requests the lifetime covers."""


@dataclass(frozen=True, slots=True)
class Lifetime:
    """A trace's request lifetime on one replica of a deployment (see the module)."""

    seconds: float
    """The longest lifetime among the requests holding ``LIFETIME_QUANTILE`` of the cache."""
    output_tokens: int
    """That request's output length."""
    step_s: float
    """The decode step of as many of the trace's requests as one replica runs at once."""
    batch: int
    """Sequences in that step."""
    batch_limit: str = "the KV cache holds"
    """What bounds ``batch``: ``the KV cache holds`` or ``max_num_seqs allows``."""

    def describe(self) -> str:
        """``the requests holding 99% of the KV cache live up to 396 s (15,982 output
        tokens at a 24.8 ms decode step of 66 sequences, as many as the KV cache holds)``."""
        return (f"the requests holding {LIFETIME_QUANTILE:.0%} of the KV cache live up to "
                f"{self.seconds:,.0f} s ({self.output_tokens:,} output tokens at a "
                f"{self.step_s * 1000:.1f} ms decode step of {self.batch:,} sequences, as "
                f"many as {self.batch_limit})")


def request_lifetime(scenario: Scenario, records: Sequence[TraceRecord],
                     config: Mapping[str, Any] | None = None) -> Lifetime:
    """The lifetime of ``records`` on one replica of ``scenario`` with knob overrides
    ``config`` (its start config by default). Requests whose prompt the KV cache cannot
    hold are left out: the engine rejects them on arrival."""
    engine = scenario.engine_config().with_overrides(config or {})
    cost = cost_model_for(scenario)
    kv_tokens = kv_tokens_for(scenario, config)
    prompt = np.fromiter((r.prompt_tokens for r in records), dtype=np.float64)
    output = np.fromiter((r.output_tokens for r in records), dtype=np.float64)
    fits = prompt <= kv_tokens
    if not fits.any():
        raise ValueError(f"records: none of the {len(records):,} prompts fits the KV cache "
                         f"of {kv_tokens:,} tokens, so none would live at all; give a "
                         "deployment whose GPUs hold them")
    prompt, output = prompt[fits], output[fits]
    # A request's mean context over its life; the full cache holds them as they live,
    # so each counts by its output length (its life, near enough).
    context = prompt + output / 2.0
    mean_context = float(np.average(context, weights=output))
    fill = max(1, int(kv_tokens // max(mean_context, 1.0)))
    batch = min(engine.max_num_seqs, fill)
    step_s = cost.iteration_time([(1, round(mean_context))] * batch)
    life = _prefill_s(cost, prompt) + output * step_s
    order = np.argsort(life, kind="stable")
    held = np.cumsum((life * context)[order])
    k = int(min(np.searchsorted(held, LIFETIME_QUANTILE * held[-1]), len(order) - 1))
    i = int(order[k])
    return Lifetime(seconds=float(life[i]), output_tokens=int(output[i]), step_s=step_s,
                    batch=batch,
                    batch_limit="the KV cache holds" if batch == fill
                    else "max_num_seqs allows")


def residency_s(scenario: Scenario, records: Sequence[TraceRecord], lifetime: Lifetime,
                config: Mapping[str, Any] | None = None) -> np.ndarray:
    """Each of ``records``' seconds in one replica's KV cache of ``scenario`` (knob
    overrides ``config``), served without queueing: its prefill plus its output tokens
    at ``lifetime``'s decode step, as ``request_lifetime`` counts them; 0 for a prompt the
    cache cannot hold (rejected on arrival). What ``windows.trace_windows`` estimates the
    cache's fullness from."""
    prompt = np.fromiter((r.prompt_tokens for r in records), dtype=np.float64)
    output = np.fromiter((r.output_tokens for r in records), dtype=np.float64)
    fits = prompt <= kv_tokens_for(scenario, config)
    life = np.zeros(len(records))
    life[fits] = _prefill_s(cost_model_for(scenario), prompt[fits]) \
        + output[fits] * lifetime.step_s
    return life


def _prefill_s(cost: IterationCostModel, prompt: np.ndarray) -> np.ndarray:
    """Each prompt's prefill alone (one iteration per distinct length)."""
    if not len(prompt):
        return np.zeros(0)
    lengths, where = np.unique(prompt.astype(np.int64), return_inverse=True)
    return np.array([cost.iteration_time([(int(n), 0)]) for n in lengths])[where]


def covering_s(lifetime: Lifetime) -> float:
    """Whole seconds that cover ``lifetime`` (a window's warm-up or drain)."""
    return float(math.ceil(lifetime.seconds))
