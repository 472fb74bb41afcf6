"""The drafts through an FP8 copy of the target's LM head (`engine.draft_head`): the copy is the
head's checkpoint-style block quantization, every speculative mode still gives the `ar` tokens (the
target verifies every draft), a batch drafts through it as each sequence alone does, and by default
only a 16-bit head on a GPU with FP8 tensor cores is copied."""

from __future__ import annotations

import random

import pytest
import torch
from torch import nn

from ddtree_kernels.host import fp8_tensor_cores
from ddtree_runtime.batching import BatchEngine
from ddtree_runtime.engine import Engine, draft_head
from ddtree_runtime.fp8 import fp8_linear_reference, quantize_weight
from ddtree_runtime.loader import load_pair
from ddtree_runtime.quant import Fp8Linear
from ddtree_runtime.tiny import SPECIALS, TinyPair
from tests.runtime.helpers import assert_same_tokens


def prompts(seed: int, count: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[len(SPECIALS) + rng.randrange(64) for _ in range(rng.randint(1, 20))] for _ in range(count)]


@pytest.fixture(scope="module")
def engine(tiny_pair: TinyPair, device: torch.device, dtype: torch.dtype) -> Engine:
    return Engine(*load_pair(tiny_pair.target, tiny_pair.drafter, device, dtype), 256, fp8_draft_head=True)


def test_the_copy_is_the_heads_block_quantization() -> None:
    torch.manual_seed(0)
    head = nn.Linear(192, 1000, bias=False)  # 1000 rows: seven whole 128-row blocks and a part
    copy = Fp8Linear.quantized(head, (128, 128), rows_per_pass=256)  # in four passes
    weight, scale = quantize_weight(head.weight.detach(), (128, 128))
    assert copy.weight.dtype == torch.float8_e4m3fn and copy.block == (128, 128)
    assert torch.equal(copy.weight.view(torch.uint8), weight.view(torch.uint8))
    assert torch.equal(copy.scale, scale)
    x = torch.randn(15, 192)
    torch.testing.assert_close(copy(x), fp8_linear_reference(x, weight, scale, (128, 128)), atol=0, rtol=0)
    with torch.no_grad():
        error = float((copy(x) - head(x)).norm() / head(x).norm())
    assert error < 0.05  # e4m3 weights and activations: a few percent of the logits' norm
    with pytest.raises(ValueError, match="bias-free"):
        Fp8Linear.quantized(nn.Linear(192, 8), (128, 128))


def test_by_default_only_a_16_bit_head_on_a_gpu_with_fp8_tensor_cores_is_copied(device: torch.device) -> None:
    head = nn.Linear(64, 97, bias=False, device=device)
    assert draft_head(head) is head  # fp32: a test model, kept as it is
    bf16 = head.to(torch.bfloat16)
    assert isinstance(draft_head(bf16), Fp8Linear) == (device.type == "cuda" and fp8_tensor_cores(device))
    assert draft_head(bf16, fp8=False) is bf16
    copy = draft_head(bf16, fp8=True)
    assert isinstance(copy, Fp8Linear) and draft_head(copy, fp8=True) is copy  # an FP8 head stays itself


def test_the_engines_default_drafts_through_the_targets_head_on_the_cpu(tiny_pair: TinyPair) -> None:
    target, drafter = load_pair(tiny_pair.target, tiny_pair.drafter, torch.device("cpu"), torch.bfloat16)
    assert Engine(target, drafter, 64).draft_head is target.lm_head


def test_every_mode_gives_the_ar_tokens_through_the_fp8_head(engine: Engine, dtype: torch.dtype) -> None:
    assert isinstance(engine.draft_head, Fp8Linear)
    accepted = 0.0
    for prompt in prompts(5, 4):
        want = engine.generate(prompt, mode="ar", max_new_tokens=32).output_ids
        for mode, budget in (("dflash", 1), ("ddtree", 1), ("ddtree", 7), ("ddtree", 64)):
            got = engine.generate(prompt, mode=mode, budget=budget, max_new_tokens=32)
            assert_same_tokens(engine, prompt, want, got.output_ids, dtype)
            accepted = max(accepted, got.mean_accepted)
    assert accepted > 2.0  # the fitted drafter's drafts survive the FP8 head


def test_a_batch_drafts_through_the_copy_as_each_sequence_alone(
    tiny_pair: TinyPair, engine: Engine, device: torch.device, dtype: torch.dtype
) -> None:
    target, drafter = load_pair(tiny_pair.target, tiny_pair.drafter, device, dtype)
    batched = BatchEngine(target, drafter, 256, 3, fp8_draft_head=True)
    assert isinstance(batched.draft_head, Fp8Linear)
    reqs = [
        {"prompt_ids": p, "mode": mode, "budget": budget, "max_new_tokens": 24, "eos_ids": ()}
        for p, (mode, budget) in zip(
            prompts(6, 6), [("dflash", 1), ("ddtree", 7), ("ddtree", 32)] * 2, strict=True
        )
    ]
    for req, result in zip(reqs, batched.run(reqs), strict=True):
        want = engine.generate(**req)
        assert_same_tokens(engine, req["prompt_ids"], want.output_ids, result.output_ids, dtype)
        if dtype == torch.float32:
            assert result.accepted_per_round == want.accepted_per_round  # the same drafts
