"""At T > 0 the speculative modes sample from the target's own distribution (chi-square, fixed seeds)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from ddtree_runtime.engine import Engine
from tests.runtime.helpers import engine_for

stats = pytest.importorskip("scipy.stats")

PROMPT = [7, 12, 9]
DRAWS = 1500
TEMPERATURE = 1.0


PAIRS = {"dense": "small_vocab_pair", "hybrid": "small_vocab_hybrid_pair"}


@pytest.fixture(scope="module")
def engines(request: pytest.FixtureRequest, device: torch.device, dtype: torch.dtype) -> dict[str, Engine]:
    """Engines by kind, built on first use: the dense Qwen3 pair and the Qwen3.5 hybrid pair (whose
    Gated DeltaNet states must follow each node's own root path)."""
    built: dict[str, Engine] = {}

    class Lazy(dict):
        def __missing__(self, kind: str) -> Engine:
            built[kind] = engine_for(request.getfixturevalue(PAIRS[kind]), device, dtype, max_context=64)
            return built[kind]

    return Lazy()


@pytest.fixture(params=list(PAIRS))
def engine(request: pytest.FixtureRequest, engines: dict[str, Engine]) -> Engine:
    return engines[request.param]


def next_probs(engine: Engine, ids: list[int]) -> torch.Tensor:
    seq = torch.tensor(ids, device=engine.device)
    with torch.inference_mode():
        logits, _ = engine.target(
            seq, torch.arange(len(seq), device=engine.device), 0, None, engine.backend, False
        )
    return torch.softmax(logits[-1].double().cpu() / TEMPERATURE, -1)


def exact_pair_distribution(engine: Engine) -> dict[tuple[int, int], float]:
    """P(t2, t3) = sum over t1 of p(t1) p(t2 | t1) p(t3 | t1, t2), from the target alone."""
    vocab = engine.target.config.vocab_size
    p1 = next_probs(engine, PROMPT)
    dist: Counter[tuple[int, int]] = Counter()
    for t1 in range(vocab):
        p2 = next_probs(engine, [*PROMPT, t1])
        for t2 in range(vocab):
            weight = float(p1[t1] * p2[t2])
            if weight < 1e-7:
                continue
            p3 = next_probs(engine, [*PROMPT, t1, t2])
            for t3 in range(vocab):
                dist[t2, t3] += weight * float(p3[t3])
    return dist


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "mode", "budget"), [("dense", "ddtree", 6), ("dense", "dflash", 1), ("hybrid", "ddtree", 6)]
)
def test_second_and_third_tokens_follow_the_target(
    engines: dict[str, Engine], kind: str, mode: str, budget: int
) -> None:
    engine = engines[kind]
    want = exact_pair_distribution(engine)
    seen: Counter[tuple[int, int]] = Counter()
    first_round_accepts = 0
    for seed in range(DRAWS):
        out = engine.generate(
            PROMPT, mode=mode, budget=budget, max_new_tokens=3, temperature=TEMPERATURE, seed=seed, eos_ids=()
        )
        seen[out.output_ids[1], out.output_ids[2]] += 1
        first_round_accepts += out.accepted_per_round[0] >= 1
    # the draws must exercise accepted drafts, not only bonus tokens
    assert first_round_accepts > DRAWS // 25
    # the joint and both marginals (the marginals have more power against a bias at one depth)
    for name, key in [("joint", lambda c: c), ("t2", lambda c: c[0]), ("t3", lambda c: c[1])]:
        assert chi_square_pvalue(seen, want, key) > 1e-3, (mode, name)


def chi_square_pvalue(seen: Counter, want: dict, key) -> float:
    """Chi-square of counts against exact probabilities, grouped by `key`; cells expected under 5
    times are pooled into one."""
    observed: Counter = Counter()
    expected: Counter = Counter()
    for cell, count in seen.items():
        observed[key(cell)] += count
    for cell, p in want.items():
        expected[key(cell)] += p * DRAWS
    big = [c for c, e in expected.items() if e >= 5]
    obs = [observed[c] for c in big]
    exp = [expected[c] for c in big]
    if sum(exp) < DRAWS - 1e-6:  # the pooled rest
        obs.append(DRAWS - sum(obs))
        exp.append(DRAWS - sum(exp))
    return float(stats.chisquare(obs, exp, sum_check=False).pvalue)


def test_sampling_is_reproducible_with_a_seed(engine: Engine) -> None:
    def run(seed: int) -> tuple[int, ...]:
        out = engine.generate(PROMPT, mode="ddtree", budget=6, max_new_tokens=12, temperature=0.8, seed=seed)
        return tuple(out.output_ids)

    assert run(5) == run(5)
    assert len({run(s) for s in range(6)}) > 1


def test_exact_distribution_sums_to_one(engine: Engine) -> None:
    assert sum(exact_pair_distribution(engine).values()) == pytest.approx(1.0, abs=1e-4)


@pytest.mark.parametrize("mode", ["ar", "dflash", "ddtree"])
def test_top_p_samples_stay_inside_the_nucleus(engine: Engine, mode: str) -> None:
    top_p = 0.5
    for seed in range(5):
        out = engine.generate(
            PROMPT,
            mode=mode,
            budget=6,
            max_new_tokens=10,
            temperature=1.0,
            top_p=top_p,
            seed=seed,
            eos_ids=(),
        )
        context = list(PROMPT)
        for token in out.output_ids:
            probs = next_probs(engine, context)
            ranked = probs.sort(descending=True)
            keep = ranked.indices[(ranked.values.cumsum(0) - ranked.values) < top_p].tolist()
            assert token in keep, (mode, seed, context, token, keep)
            context.append(token)
