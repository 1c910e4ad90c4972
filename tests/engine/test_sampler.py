from __future__ import annotations

import pytest
import torch

from slopilot.engine.executors.sampler import Sampler, filter_logits
from slopilot.engine.request import SamplingParams

VOCAB = 50


def _logits(rows: int = 4, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def test_temperature_zero_is_greedy() -> None:
    logits = _logits()
    params = [SamplingParams(temperature=0.0)] * 4
    assert Sampler().sample(logits, params, [0] * 4) == logits.argmax(-1).tolist()


def test_top_k_one_is_greedy_at_any_temperature() -> None:
    logits = _logits()
    params = [SamplingParams(temperature=5.0, top_k=1, seed=i) for i in range(4)]
    assert Sampler().sample(logits, params, [3] * 4) == logits.argmax(-1).tolist()


def test_seeded_sampling_is_reproducible_and_independent_of_the_batch() -> None:
    logits = _logits(rows=1)
    mine = SamplingParams(temperature=3.0, seed=1234)
    alone = [Sampler(seed=s).sample(logits, [mine], [n])[0] for s in (0, 1) for n in range(20)]
    # The same row inside a batch with unseeded neighbours drawing from the shared RNG.
    batch = torch.cat([_logits(rows=2, seed=5), logits])
    others = SamplingParams(temperature=1.0)
    sampler = Sampler(seed=9)
    mixed = [sampler.sample(batch, [others, others, mine], [0, 0, n])[2] for n in range(20)]
    assert alone[:20] == alone[20:] == mixed
    # Different output positions draw different tokens (the seed is mixed with n).
    assert len(set(mixed)) > 3


def test_seeds_differ() -> None:
    logits = _logits(rows=1)
    draws = {
        tuple(Sampler().sample(logits, [SamplingParams(temperature=3.0, seed=s)], [n])[0]
              for n in range(10))
        for s in range(5)}
    assert len(draws) == 5


def test_top_p_restricts_the_support() -> None:
    logits = torch.tensor([[4.0, 3.0, 2.0, -1.0, -2.0, -3.0]])
    probs = logits.softmax(-1)[0]
    # The two best tokens hold about 0.9 of the mass; top_p=0.8 keeps exactly them.
    assert probs[0] < 0.8 < probs[0] + probs[1]
    params = SamplingParams(temperature=1.0, top_p=0.8, seed=7)
    sampler = Sampler()
    seen = {sampler.sample(logits, [params], [n])[0] for n in range(300)}
    assert seen == {0, 1}
    kept = filter_logits(logits[0], params).isfinite()
    assert kept.tolist() == [True, True, False, False, False, False]


def test_top_p_always_keeps_the_best_token() -> None:
    logits = torch.tensor([0.5, 0.4, 0.3])
    kept = filter_logits(logits, SamplingParams(temperature=1.0, top_p=0.01)).isfinite()
    assert kept.tolist() == [True, False, False]


def test_top_k_restricts_the_support() -> None:
    logits = _logits(rows=1)
    params = SamplingParams(temperature=10.0, top_k=3, seed=3)
    top3 = set(torch.topk(logits[0], 3).indices.tolist())
    seen = {Sampler().sample(logits, [params], [n])[0] for n in range(200)}
    assert seen == top3


def test_sampling_follows_the_distribution() -> None:
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1]]))
    params = SamplingParams(temperature=1.0, seed=11)
    draws = [Sampler().sample(logits, [params], [n])[0] for n in range(2000)]
    freq = torch.bincount(torch.tensor(draws), minlength=3).float() / len(draws)
    torch.testing.assert_close(freq, torch.tensor([0.7, 0.2, 0.1]), atol=0.04, rtol=0)


def test_mismatched_rows_are_refused() -> None:
    with pytest.raises(ValueError, match="2 logit rows for 1 sampling params"):
        Sampler().sample(_logits(rows=2), [SamplingParams()], [0])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_sampled_rows_read_the_device_once_whatever_their_number() -> None:
    """Each host read of a GPU tensor waits for the device; a batch of temperature-sampled
    rows read each row's draw on its own (8 rows, 8 waits)."""
    import warnings

    def syncs(rows: int) -> int:
        sampler = Sampler(seed=0, device="cuda")
        logits = torch.randn(rows, 100, device="cuda")
        params = [SamplingParams(temperature=1.0, top_p=0.9, top_k=20, seed=i)
                  for i in range(rows)]
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                sampler.sample(logits, params, [0] * rows)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        return sum("synchroniz" in str(w.message) for w in seen)

    assert syncs(8) == syncs(2) >= 1
