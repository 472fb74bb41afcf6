"""Logprobs of generated tokens: the target's own distribution where each token was chosen.

The oracle is one plain causal forward of the target over prompt + output: row i's log_softmax
(fp32) is the distribution of output token i. A verify pass computes the same rows in matmuls of
another shape, which round differently in the last bits (ar's one-row steps too), so values agree
within fp32 rounding (1e-5 on log-probabilities of magnitude up to ~30), not bit for bit; the
token ids, and in fp32 the top ids, agree exactly.
"""

from __future__ import annotations

import random

import pytest
import torch

from ddtree_runtime import logprobs
from ddtree_runtime.engine import Engine, GenerationError
from ddtree_runtime.logprobs import MAX_LOGPROBS, TokenLogprob
from ddtree_runtime.tiny import SPECIALS, TinyPair
from tests.runtime.helpers import assert_close, engine_for

TOP = 5
# fp32 logprobs of unlikely tokens (-8 to -17) carry the logits' rounding at their own scale: the two
# paths (rounds or chunked prompt rows against one forward) differ by up to 2.8e-6 of it on some CPUs
LOGPROB_RTOL = 5e-6


@pytest.fixture(scope="module")
def engine(tiny_pair: TinyPair, device: torch.device, dtype: torch.dtype) -> Engine:
    return engine_for(tiny_pair, device, dtype)


def prompts(seed: int, count: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[len(SPECIALS) + rng.randrange(64) for _ in range(rng.randint(1, 12))] for _ in range(count)]


def full_forward_logprobs(engine: Engine, prompt: list[int], output: list[int]) -> torch.Tensor:
    """[len(output), V]: log_softmax of one causal forward over prompt + output, at each output token's row."""
    ids = torch.tensor(prompt + output[:-1], device=engine.device)
    with torch.inference_mode():
        logits, _ = engine.target(
            ids, torch.arange(len(ids), device=engine.device), 0, None, engine.backend, False
        )
    return torch.log_softmax(logits.float(), dim=-1)[len(prompt) - 1 :]


def assert_target_logprobs(
    engine: Engine, prefix: list[int], tokens: list[int], got: list[TokenLogprob] | None, dtype: torch.dtype
) -> None:
    """`got` holds the target's logprobs of `tokens` where each follows `prefix` and the tokens before it."""
    assert got is not None and [e.token for e in got] == tokens
    want = full_forward_logprobs(engine, prefix, tokens)
    ids = torch.tensor(tokens, device=want.device)
    values = torch.tensor([e.logprob for e in got], dtype=torch.float64)
    assert_close(values, want.gather(1, ids[:, None]).squeeze(1).cpu(), dtype, atol=1e-5, rtol=LOGPROB_RTOL)
    best = want.topk(TOP, dim=-1)
    top_values = torch.tensor([[v for _, v in e.top] for e in got], dtype=torch.float64)
    assert_close(top_values, best.values.cpu(), dtype, atol=1e-5, rtol=LOGPROB_RTOL)
    if dtype == torch.float32:  # bf16 may order near-ties the other way
        assert [[i for i, _ in e.top] for e in got] == best.indices.tolist()
        if got[0].rank is not None:
            assert [e.rank for e in got] == [
                1 + int((r > r[t]).sum()) for r, t in zip(want, tokens, strict=True)
            ]


@pytest.mark.parametrize("mode", ["ar", "dflash", "ddtree"])
def test_greedy_logprobs_are_the_targets_and_change_no_token(
    engine: Engine, mode: str, dtype: torch.dtype
) -> None:
    for prompt in prompts(5, 3):
        plain = engine.generate(prompt, mode=mode, budget=16, max_new_tokens=24, eos_ids=())
        got = engine.generate(prompt, mode=mode, budget=16, max_new_tokens=24, eos_ids=(), logprobs=TOP)
        assert plain.logprobs is None and got.output_ids == plain.output_ids
        if mode != "ar":
            assert got.mean_accepted > 1.5  # drafts were accepted: several tokens' rows per round
        assert_target_logprobs(engine, prompt, got.output_ids, got.logprobs, dtype)


def test_hybrid_target_logprobs_are_its_own(
    hybrid_pair: TinyPair, device: torch.device, dtype: torch.dtype
) -> None:
    """A Gated DeltaNet target verifies a tree through other kernels; its rows are its own too."""
    hybrid = engine_for(hybrid_pair, device, dtype)
    for prompt in prompts(6, 2):
        got = hybrid.generate(
            prompt, mode="ddtree", budget=16, max_new_tokens=24, eos_ids=(), logprobs=TOP, prompt_top=TOP
        )
        assert_target_logprobs(hybrid, prompt, got.output_ids, got.logprobs, dtype)
        assert_target_logprobs(hybrid, prompt[:1], prompt[1:], got.prompt_logprobs, dtype)


@pytest.mark.parametrize("mode", ["ar", "ddtree"])
def test_sampled_logprobs_are_the_raw_distribution_s(engine: Engine, mode: str, dtype: torch.dtype) -> None:
    """At T > 0 with top-p the tokens are sampled from the tempered nucleus, yet the logprobs
    reported are the raw logits' (vLLM's default)."""
    prompt = prompts(8, 1)[0]
    got = engine.generate(
        prompt,
        mode=mode,
        budget=16,
        max_new_tokens=24,
        eos_ids=(),
        logprobs=TOP,
        temperature=1.5,
        top_p=0.9,
        seed=4,
    )
    assert_target_logprobs(engine, prompt, got.output_ids, got.logprobs, dtype)


def test_streamed_logprobs_come_with_their_round_and_stop_with_the_output(engine: Engine) -> None:
    """`on_logprobs` gets each round's entries before its tokens; an EOS cut keeps them aligned."""
    prompt = prompts(9, 1)[0]
    rounds: list[tuple[str, list[int]]] = []
    whole = engine.generate(prompt, mode="ddtree", budget=16, max_new_tokens=20, eos_ids=())
    eos = whole.output_ids[7]
    got = engine.generate(
        prompt,
        mode="ddtree",
        budget=16,
        max_new_tokens=20,
        eos_ids=(eos,),
        logprobs=0,
        on_logprobs=lambda es: rounds.append(("logprobs", [e.token for e in es])),
        on_tokens=lambda ts: rounds.append(("tokens", ts)),
    )
    assert got.stop_reason == "eos" and got.output_ids[-1] == eos
    assert got.logprobs is not None and len(got.logprobs) == len(got.output_ids)
    assert all(e.top == () for e in got.logprobs)
    assert [kind for kind, _ in rounds] == ["logprobs", "tokens"] * (len(rounds) // 2)
    assert all(rounds[i][1] == rounds[i + 1][1] for i in range(0, len(rounds), 2))


@pytest.mark.parametrize("chunk_rows", [3, None])
def test_prompt_logprobs_are_the_targets_a_chunk_of_rows_at_a_time(
    engine: Engine, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch, chunk_rows: int | None
) -> None:
    """Prompt token i's logprob and rank after tokens [0, i), through the LM head 3 rows at a time
    (or the whole prompt at once); asking changes no generated token."""
    vocab = engine.target.config.vocab_size
    if chunk_rows is not None:
        monkeypatch.setattr(logprobs, "CHUNK_LOGITS", chunk_rows * vocab)
    prompt = [len(SPECIALS) + i % 64 for i in range(3, 40, 3)]
    plain = engine.generate(prompt, mode="ddtree", budget=16, max_new_tokens=12, eos_ids=())
    got = engine.generate(prompt, mode="ddtree", budget=16, max_new_tokens=12, eos_ids=(), prompt_top=TOP)
    assert plain.prompt_logprobs is None and got.output_ids == plain.output_ids
    assert got.prompt_logprobs is not None and [e.token for e in got.prompt_logprobs] == prompt[1:]
    assert_target_logprobs(engine, prompt[:1], prompt[1:], got.prompt_logprobs, dtype)
    assert max(e.rank or 0 for e in got.prompt_logprobs) > 1  # not only the most likely tokens


def test_too_many_top_logprobs_are_refused(engine: Engine) -> None:
    with pytest.raises(GenerationError, match=f"logprobs {MAX_LOGPROBS + 1} is outside"):
        engine.generate([5, 6], mode="ar", max_new_tokens=2, logprobs=MAX_LOGPROBS + 1)
    with pytest.raises(GenerationError, match="prompt_top -1 is outside"):
        engine.generate([5, 6], mode="ar", max_new_tokens=2, prompt_top=-1)
