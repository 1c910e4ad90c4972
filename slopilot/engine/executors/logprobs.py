"""Log-probabilities as vLLM returns them: log-softmax of the model's raw logits.

Raw means before temperature, penalties, bias or top-k/top-p: what the model thinks,
not what the sampler did with it (vLLM's default ``raw_logprobs`` mode). A token's rank
is 1 plus the number of tokens strictly more likely.
"""

from __future__ import annotations

import torch

from slopilot.engine.request import TokenLogprobs


def gather_logprobs(logits: torch.Tensor, token_ids: list[int], num_top: list[int]
                    ) -> list[TokenLogprobs]:
    """One entry per row of ``logits`` [rows, vocab]: ``token_ids[i]``'s logprob, its
    rank, and the ``num_top[i]`` most likely tokens."""
    if not token_ids:
        return []
    logp = torch.log_softmax(logits.float(), dim=-1)
    ids = torch.tensor(token_ids, dtype=torch.long, device=logp.device)
    chosen = logp.gather(1, ids[:, None]).squeeze(1)
    ranks = (logp > chosen[:, None]).sum(dim=1) + 1
    k = max(num_top)
    if k > 0:
        values, indices = logp.topk(k, dim=-1)
        top_vals_l, top_ids_l = values.tolist(), indices.tolist()
    else:
        top_vals_l = top_ids_l = [[] for _ in token_ids]
    chosen_l, ranks_l = chosen.tolist(), ranks.tolist()
    return [TokenLogprobs(token_ids[i], chosen_l[i], int(ranks_l[i]),
                          tuple(zip(top_ids_l[i][:num_top[i]], top_vals_l[i][:num_top[i]],
                                    strict=True)))
            for i in range(len(token_ids))]
