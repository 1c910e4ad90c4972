"""Penalties, logit bias and logprobs on the torch executor, against transformers.

transformers has the repetition penalty and (single-token) sequence bias as logits
processors, and temperature / top-k / top-p as warpers: our processing must give the
same logits, greedy generation the same tokens as ``generate``, and the logprobs must be
the log-softmax of the model's own logits. Frequency and presence penalties have no
transformers processor; they are checked against OpenAI's formula.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from slopilot.engine.config import EngineConfig
from slopilot.engine.engine import LLMEngine, VirtualClock
from slopilot.engine.executors.penalties import process_row
from slopilot.engine.executors.sampler import filter_logits
from slopilot.engine.executors.torch_runner import TorchExecutor
from slopilot.engine.request import Request, SamplingParams

transformers = pytest.importorskip("transformers")
from transformers.generation.logits_process import (  # noqa: E402
    LogitsProcessorList,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")
VOCAB = 300


def _logits(seed: int = 0) -> torch.Tensor:
    return torch.randn(VOCAB, generator=torch.Generator().manual_seed(seed)) * 4


def _hf(processors: list[object], ids: list[int], logits: torch.Tensor) -> torch.Tensor:
    out: torch.Tensor = LogitsProcessorList(processors)(  # type: ignore[arg-type]
        torch.tensor([ids]), logits[None].clone())
    return out[0]


def test_bias_and_repetition_penalty_match_transformers() -> None:
    prompt, output = [5, 9, 9, 40, 77], [40, 123, 5, 200]
    bias = {9: 3.5, 250: -7.0, 123: 1.0}
    params = SamplingParams(repetition_penalty=1.7,
                            logit_bias=tuple(bias.items()))
    ours = process_row(_logits(), params, prompt, output)
    theirs = _hf([SequenceBiasLogitsProcessor({(t,): b for t, b in bias.items()}),
                  RepetitionPenaltyLogitsProcessor(1.7)], prompt + output, _logits())
    torch.testing.assert_close(ours, theirs)


def test_frequency_and_presence_follow_the_openai_formula() -> None:
    prompt, output = [1, 2, 3], [7, 7, 7, 8, 3]
    params = SamplingParams(frequency_penalty=0.5, presence_penalty=1.25)
    ours = process_row(_logits(1), params, prompt, output)
    expected = _logits(1).clone()
    for token in set(output):
        count = output.count(token)
        expected[token] -= 0.5 * count + 1.25  # mu[j] - c[j] * a_freq - (c[j] > 0) * a_pres
    torch.testing.assert_close(ours, expected)  # prompt tokens are not penalized


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), [
    (0.7, 0, 1.0), (1.3, 20, 1.0), (0.9, 0, 0.8), (1.0, 50, 0.9)])
def test_seeded_sampling_draws_from_the_transformers_distribution(
        temperature: float, top_k: int, top_p: float) -> None:
    prompt, output = [10, 11, 12], [11, 13]
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=7,
                            repetition_penalty=1.2, logit_bias=((13, 2.0),))
    ours = filter_logits(process_row(_logits(2), params, prompt, output), params)
    warpers: list[object] = [SequenceBiasLogitsProcessor({(13,): 2.0}),
                             RepetitionPenaltyLogitsProcessor(1.2),
                             TemperatureLogitsWarper(temperature)]
    if top_k:
        warpers.append(TopKLogitsWarper(top_k))
    if top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p))
    theirs = _hf(warpers, prompt + output, _logits(2))
    torch.testing.assert_close(ours.softmax(-1), theirs.softmax(-1))


# --------------------------------------------------------------- the model end to end
@pytest.fixture(scope="module")
def hf_model(tiny: Path) -> torch.nn.Module:
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tiny), dtype=torch.float32)
    return model.eval()


def _engine(tiny: Path, **knobs: object) -> LLMEngine:
    executor = TorchExecutor(tiny, num_gpu_blocks=64, num_cpu_blocks=0, block_size=16)
    cfg = EngineConfig().with_overrides({"budget_align": 1, **knobs})
    return LLMEngine(cfg, executor, executor.num_gpu_blocks, clock=VirtualClock())


def _run(engine: LLMEngine, requests: list[Request]) -> dict[str, Request]:
    for r in requests:
        engine.add_request(r)
    engine.run_until_idle()
    return {r.request_id: r for r in requests}


def _prompt(n: int, seed: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 250, (n,), generator=g).tolist()


def test_greedy_with_penalties_matches_transformers_generate(
        tiny: Path, hf_model: torch.nn.Module) -> None:
    prompt = _prompt(40)
    penalized = SamplingParams(max_tokens=12, ignore_eos=True, repetition_penalty=1.8,
                               logit_bias=((prompt[3], 4.0), (17, -100.0)))
    plain = SamplingParams(max_tokens=12, ignore_eos=True)
    done = _run(_engine(tiny), [Request("pen", prompt, penalized),
                                Request("plain", _prompt(30, 1), plain)])
    with torch.inference_mode():
        theirs = hf_model.generate(  # type: ignore[operator]
            torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
            repetition_penalty=1.8, sequence_bias={(prompt[3],): 4.0, (17,): -100.0},
            eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
        unpenalized = hf_model.generate(  # type: ignore[operator]
            torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=None,
            pad_token_id=0)[0, len(prompt):].tolist()
    assert done["pen"].output_token_ids == theirs
    assert theirs != unpenalized  # the penalty mattered
    assert 17 not in theirs


def test_logprobs_are_the_log_softmax_of_the_models_logits(
        tiny: Path, hf_model: torch.nn.Module) -> None:
    prompt = _prompt(150, 3)  # three prefill chunks of at most 64
    params = SamplingParams(max_tokens=5, ignore_eos=True, logprobs=3, prompt_logprobs=2,
                            temperature=0.8, seed=11)
    req = _run(_engine(tiny, token_budget=128, chunk_size=64),
               [Request("a", prompt, params)])["a"]
    full = prompt + req.output_token_ids
    with torch.inference_mode():
        logp = torch.log_softmax(hf_model(torch.tensor([full])).logits[0].float(), -1)
    assert len(req.output_logprobs) == 5 and len(req.prompt_logprobs) == len(prompt) - 1
    for i, entry in enumerate(req.prompt_logprobs):
        row = logp[i]
        assert entry.token_id == prompt[i + 1]
        assert math.isclose(entry.logprob, float(row[prompt[i + 1]]), abs_tol=1e-4)
        assert [t for t, _ in entry.top] == row.topk(2).indices.tolist()
        assert entry.rank == int((row > row[prompt[i + 1]]).sum()) + 1
    for i, entry in enumerate(req.output_logprobs):
        row = logp[len(prompt) - 1 + i]
        assert entry.token_id == req.output_token_ids[i]
        # Raw logprobs: the model's, not the temperature-scaled distribution drawn from.
        assert math.isclose(entry.logprob, float(row[entry.token_id]), abs_tol=1e-4)
        assert [t for t, _ in entry.top] == row.topk(3).indices.tolist()
        assert all(math.isclose(lp, float(row[t]), abs_tol=1e-4) for t, lp in entry.top)


def test_a_requests_logit_bias_becomes_tensors_once_not_every_step(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A bias over the whole vocabulary (128k entries) rebuilt from its Python pairs on
    # every step took ~23 ms per row per step: one request slowed every batch it rode
    # in. Built once per request, the steps after the first only add it.
    from slopilot.engine.executors import penalties
    from slopilot.engine.executors.sampler import Sampler

    vocab = 4096
    params = SamplingParams(max_tokens=8, logit_bias=tuple((t, 0.5) for t in range(vocab)))
    plain = SamplingParams(max_tokens=8, repetition_penalty=1.1)
    built: list[int] = []
    real_tensor = torch.tensor

    def counting(data: object, *args: object, **kwargs: object) -> torch.Tensor:
        if isinstance(data, (list, tuple)) and len(data) == vocab:
            built.append(len(data))
        return real_tensor(data, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(penalties.torch, "tensor", counting)
    sampler = Sampler()
    logits = torch.zeros(2, vocab)
    for step in range(5):
        sampler.sample(logits, [params, plain], [step, step], [([1], [2] * step)] * 2)
    assert len(built) == 2, f"the bias was built {len(built) // 2} times in 5 steps"
    # What it adds is the same as building it afresh.
    row = process_row(torch.zeros(vocab), params, [1], [])
    assert torch.equal(row, torch.full((vocab,), 0.5))
