"""Iteration time with the batch's shape: the engine's step time and its series."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from slopilot.engine.config import EngineConfig
from slopilot.engine.engine import LLMEngine, WallClock
from slopilot.engine.metrics import EngineMetrics
from slopilot.engine.metrics_observer import MetricsObserver
from slopilot.engine.outputs import ModelRunnerOutput, SchedulerOutput
from tests.engine.helpers import make_request


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class TickingExecutor:
    """Takes ``exec_s`` of the shared clock per iteration (as a real executor would)."""

    def __init__(self, clock: Clock, exec_s: float) -> None:
        self.clock, self.exec_s = clock, exec_s

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        self.clock.t += self.exec_s
        return ModelRunnerOutput({s.request_id: 50 for s in out.seqs if s.sample},
                                 self.exec_s)


def _engine(clock: Clock, exec_s: float = 0.010) -> tuple[LLMEngine, EngineMetrics]:
    metrics = EngineMetrics("tiny", clock=clock)
    engine = LLMEngine(EngineConfig(budget_align=1), TickingExecutor(clock, exec_s), 100,
                       clock=WallClock(clock), observers=[])
    engine.observers.append(MetricsObserver(metrics))
    return engine, metrics


def test_step_time_runs_from_the_previous_end_while_busy_and_from_the_start_after_idle(
        ) -> None:
    clock = Clock()
    engine, _ = _engine(clock)
    engine.add_request(make_request("a", 8, max_tokens=3))
    engine.step()  # first after idle: schedule + execute
    assert engine.last_step_s == pytest.approx(0.010)
    clock.t += 0.003  # bookkeeping between iterations (a server's delivery, the driver)
    engine.step()
    assert engine.last_step_s == pytest.approx(0.013)  # the token gap the request saw
    engine.step()  # last token: the engine goes idle
    assert not engine.has_work()
    clock.t += 5.0  # idle
    engine.add_request(make_request("b", 8, max_tokens=2))
    engine.step()
    assert engine.last_step_s == pytest.approx(0.010)  # not the idle time


def test_the_series_carry_step_time_executor_time_and_shape_by_kind() -> None:
    clock = Clock()
    engine, metrics = _engine(clock)
    engine.add_request(make_request("a", 8, max_tokens=3))
    engine.step()
    clock.t += 0.002
    engine.step()
    engine.step()
    fams = {f.name: f for f in text_string_to_metric_families(metrics.render().decode())}
    seconds = {(s.labels["kind"], s.name.rsplit("_", 1)[-1]): s.value
               for s in fams["slopilot_iteration_seconds"].samples
               if not s.name.endswith("_bucket")}
    assert seconds[("prefill", "count")] == 1 and seconds[("decode", "count")] == 2
    assert abs(seconds[("decode", "sum")] - 0.022) < 1e-9
    executor = {s.labels["kind"]: s.value
                for s in fams["slopilot_iteration_executor_seconds"].samples}
    assert abs(executor["decode"] - 0.020) < 1e-9
    shape = {(s.labels["kind"], s.labels["feature"]): s.value
             for s in fams["slopilot_iteration_shape"].samples}
    assert shape[("prefill", "tokens")] == 8 and shape[("prefill", "prefill_attention")] == 36
    assert shape[("decode", "decode_seqs")] == 2
    assert shape[("decode", "decode_context")] == 9 + 10  # contexts 8 and 9, plus itself
    assert shape[("mixed", "iteration")] == 0
    # Only the first iteration followed an idle engine (cold caches are charged once).
    assert shape[("prefill", "idle_starts")] == 1 and shape[("decode", "idle_starts")] == 0


def _exported_shape(executor: TickingExecutor, clock: Clock, requests: int, prompt: int,
                    max_tokens: int) -> tuple[LLMEngine, dict[tuple[str, str], float]]:
    """Serve ``requests`` alike to the end; the engine and its exported shape sums."""
    metrics = EngineMetrics("tiny", clock=clock)
    engine = LLMEngine(EngineConfig(budget_align=1), executor, 400, clock=WallClock(clock),
                       observers=[MetricsObserver(metrics)])
    for i in range(requests):
        engine.add_request(make_request(f"r{i}", prompt, max_tokens=max_tokens))
    while engine.has_work():
        engine.step()
    shape = {(s.labels["kind"], s.labels["feature"]): s.value
             for fam in text_string_to_metric_families(metrics.render().decode())
             for s in fam.samples if s.name == "slopilot_iteration_shape_total"}
    return engine, shape


def test_the_exported_spill_feature_uses_the_executors_cache_knee() -> None:
    # 4 decodes at context 200 pad to 4 x 201 = 804 KV tokens; a knee of 500 leaves 304
    # beyond the cache, which the twin's profile charges and a live refit needs.
    clock = Clock()
    executor = TickingExecutor(clock, 0.01)
    executor.decode_knee_tokens = 500  # type: ignore[attr-defined]
    engine, shape = _exported_shape(executor, clock, 4, 200, 2)
    assert engine.decode_knee == 500
    assert shape[("decode", "decode_spill")] == 4 * 201 - 500
    # An engine told its knee outright uses that one.
    assert LLMEngine(EngineConfig(), executor, 10, decode_knee=7).decode_knee == 7


def test_the_exported_eager_passes_follow_the_executors_graphs() -> None:
    # An executor replaying decode batches of up to 2 rows from graphs: the prefill and
    # the 3-row decodes run eagerly, so a live refit sees what the profile charges.
    clock = Clock()
    executor = TickingExecutor(clock, 0.01)
    executor.graph_batch = 2  # type: ignore[attr-defined]
    engine, shape = _exported_shape(executor, clock, 3, 20, 3)
    assert engine.graph_batch == 2
    for kind in ("prefill", "decode"):
        assert shape[(kind, "eager_passes")] == shape[(kind, "iteration")] > 0
    assert LLMEngine(EngineConfig(), TickingExecutor(clock, 0.01), 10).graph_batch is None
    assert LLMEngine(EngineConfig(), executor, 10, graph_batch=8).graph_batch == 8


def prompt_tokens_total(metrics: EngineMetrics) -> float:
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            if s.name == "vllm:prompt_tokens_total":
                return s.value
    raise AssertionError("no vllm:prompt_tokens_total")


def test_prompt_tokens_count_when_the_prefill_is_done_as_vllm_counts_them() -> None:
    # vLLM adds a request's prompt to prompt_tokens_total at its first token; counted at
    # the finish, a window's prompts were those of requests that ended in it, and
    # right after a shift in prompt lengths the probe read the old ones.
    clock = Clock()
    engine, metrics = _engine(clock)
    req = make_request("a", 40, max_tokens=50)
    engine.add_request(req)
    while req.first_token_time is None:
        engine.step()
    assert prompt_tokens_total(metrics) == 40
    while engine.has_work():
        engine.step()
    assert prompt_tokens_total(metrics) == 40  # once, not again at the finish
