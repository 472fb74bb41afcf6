"""Log-probabilities as vLLM reports them: the target's own, log_softmax of its raw logits in fp32
(before temperature and top-p: vLLM's default `raw_logprobs`), with the most likely tokens.

Generated tokens get theirs in the rounds (`RoundBuffers.record_logprobs`), prompt tokens from the
prefill's final hidden rows, through the LM head a chunk of rows at a time so that a long prompt
never holds [T, V] logits at once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

MAX_LOGPROBS = 20  # the most top logprobs a request may ask for (vLLM's default max_logprobs)
CHUNK_LOGITS = 1 << 24  # prompt rows' logits held at once, in elements (64 MiB of fp32)


@dataclass(frozen=True)
class TokenLogprob:
    """A token's log-probability under the target where it was chosen (or, in a prompt, where it
    follows), and the `top` most likely tokens there as (id, log-probability), best first. `rank`
    (1 = the most likely) is filled for prompt tokens, as vLLM's prompt_logprobs report it."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()
    rank: int | None = None


def token_logprobs(logits: Tensor, tokens: Tensor, top: int) -> tuple[Tensor, Tensor]:
    """logits [m, V], tokens [m] -> ([m, 1 + top] fp32: each token's log-probability, then the `top`
    best; [m, top] their ids). Fixed shapes, no host sync: a captured round may run it."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    best = lp.topk(top, dim=-1)
    return torch.cat([lp.gather(1, tokens[:, None]), best.values], dim=1), best.indices


def as_entries(
    tokens: list[int],
    values: list[list[float]],
    ids: list[list[int]],
    top: int,
    ranks: list[int] | None = None,
) -> list[TokenLogprob]:
    """Host rows of `token_logprobs` as one entry per token, keeping the `top` best."""
    return [
        TokenLogprob(
            t, v[0], tuple(zip(i[:top], v[1 : 1 + top], strict=True)), None if ranks is None else ranks[k]
        )
        for k, (t, v, i) in enumerate(zip(tokens, values, ids, strict=True))
    ]


def prompt_logprobs(
    normed: Tensor, prompt: Tensor, lm_head: Callable[[Tensor], Tensor], vocab: int, top: int
) -> list[TokenLogprob]:
    """Prompt token i's (i >= 1) log-probability after tokens [0, i), its rank and the `top` most
    likely there, from the prefill's final normed rows [T, H] (row i - 1 predicts token i)."""
    rows = max(1, CHUNK_LOGITS // vocab)
    out: list[TokenLogprob] = []
    for start in range(0, prompt.shape[0] - 1, rows):
        end = min(start + rows, prompt.shape[0] - 1)
        logits, tokens = lm_head(normed[start:end]).float(), prompt[start + 1 : end + 1]
        values, ids = token_logprobs(logits, tokens, top)
        ranks = 1 + (logits > logits.gather(1, tokens[:, None])).sum(-1)
        out += as_entries(tokens.tolist(), values.tolist(), ids.tolist(), top, ranks.tolist())
    return out
