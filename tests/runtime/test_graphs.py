"""The CUDA-graph decode path, dense and hybrid: replayed rounds give the eager path's tokens bit for
bit, and after `Engine.warmup` no request pays a Triton compile. CUDA only (CI has no GPU; run on a GPU host with
`SPECOPS_TEST_DEVICE=cuda pytest tests/runtime/test_graphs.py`); the eager rounds these compare
against run everywhere, in every other runtime test."""

from __future__ import annotations

import importlib
import pkgutil
import random

import pytest
import torch
import triton
from triton.runtime.jit import JITFunction

import ddtree_kernels
from ddtree_runtime.engine import Engine, GenerationError
from ddtree_runtime.loader import load_pair
from ddtree_runtime.tiny import SPECIALS, TinyPair

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")


def _engines(pair: TinyPair, dtype: torch.dtype) -> tuple[Engine, Engine]:
    device = torch.device("cuda")
    graphed = Engine(*load_pair(pair.target, pair.drafter, device, dtype), 512, graphs=True)
    eager = Engine(*load_pair(pair.target, pair.drafter, device, dtype), 512, graphs=False)
    return graphed, eager


def _prompts(seed: int, count: int, longest: int = 40) -> list[list[int]]:
    rng = random.Random(seed)
    return [[len(SPECIALS) + rng.randrange(64) for _ in range(rng.randint(1, longest))] for _ in range(count)]


@pytest.fixture(params=["dense", "hybrid"])
def pair(request: pytest.FixtureRequest) -> TinyPair:
    """The dense tiny pair and the hybrid one (Gated DeltaNet states in the graphs)."""
    return request.getfixturevalue("tiny_pair" if request.param == "dense" else "hybrid_pair")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_graph_replays_give_the_eager_tokens(pair: TinyPair, dtype: torch.dtype) -> None:
    graphed, eager = _engines(pair, dtype)
    for prompt in _prompts(3, 6):
        for mode, budget in (("ar", 1), ("dflash", 1), ("ddtree", 4), ("ddtree", 64)):
            want = eager.generate(prompt, mode=mode, budget=budget, max_new_tokens=48, eos_ids=())
            got = graphed.generate(prompt, mode=mode, budget=budget, max_new_tokens=48, eos_ids=())
            assert got.output_ids == want.output_ids, (mode, budget, prompt)
            assert got.accepted_per_round == want.accepted_per_round
            assert got.phase_s["round"] > 0 and want.phase_s["round"] == 0
    if dtype == torch.float32:  # and both are the ar tokens (the losslessness tests, graphed)
        for prompt in _prompts(4, 4):
            ar = graphed.generate(prompt, mode="ar", max_new_tokens=40).output_ids
            for mode, budget in (("dflash", 1), ("ddtree", 7), ("ddtree", 256)):
                assert graphed.generate(prompt, mode=mode, budget=budget, max_new_tokens=40).output_ids == ar


def test_a_logprobs_request_runs_eager_rounds_with_the_graphed_tokens(pair: TinyPair) -> None:
    """Logprobs rounds are not captured: they run the phases one by one, to the same tokens."""
    graphed = Engine(*load_pair(pair.target, pair.drafter, torch.device("cuda"), torch.float32), 512)
    for prompt in _prompts(6, 3):
        for mode, budget in (("ar", 1), ("dflash", 1), ("ddtree", 16)):
            want = graphed.generate(prompt, mode=mode, budget=budget, max_new_tokens=32, eos_ids=())
            got = graphed.generate(
                prompt, mode=mode, budget=budget, max_new_tokens=32, eos_ids=(), logprobs=5, prompt_top=5
            )
            assert got.output_ids == want.output_ids, (mode, prompt)
            assert got.phase_s["round"] == 0 < want.phase_s["round"]
            assert got.logprobs is not None and len(got.logprobs) == len(got.output_ids)
            assert got.prompt_logprobs is not None and len(got.prompt_logprobs) == len(prompt) - 1


def _compiled() -> int:
    """Compiled specialisations of every Triton kernel in the kernels package, on every device."""
    total = 0
    for info in pkgutil.iter_modules(ddtree_kernels.__path__):
        module = importlib.import_module(f"ddtree_kernels.{info.name}")
        for obj in vars(module).values():
            if isinstance(obj, JITFunction):
                total += sum(len(entry[0]) for entry in obj.device_caches.values())
    return total


def test_no_compile_after_warmup(pair: TinyPair) -> None:
    engine = Engine(*load_pair(pair.target, pair.drafter, torch.device("cuda"), torch.bfloat16), 512)
    engine.warmup(["ar", "dflash", "ddtree"], [4, 16], max_prompt=300)
    before = _compiled()
    assert before > 0, f"no compiled kernels seen: has Triton {triton.__version__} moved its cache?"
    rng = random.Random(0)
    for prompt in _prompts(5, 12, longest=300):
        mode, budget = rng.choice([("ar", 4), ("dflash", 4), ("ddtree", 4), ("ddtree", 16)])
        temperature = rng.choice([0.0, 0.8])
        engine.generate(
            prompt,
            mode=mode,
            budget=budget,
            max_new_tokens=rng.randint(1, 60),
            temperature=temperature,
            seed=1,
        )
    assert _compiled() == before
    with pytest.raises(GenerationError, match="not warmed"):
        engine.generate([5, 6, 7], mode="ddtree", budget=8, max_new_tokens=4)
