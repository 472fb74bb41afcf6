"""Our Qwen3 forward against transformers' Qwen3ForCausalLM on the same random checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ddtree_runtime.backend import TorchBackend
from ddtree_runtime.loader import load_target, weight_files
from tests.runtime.helpers import assert_close, write_hf_qwen3

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied-sharded"])
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tied = request.param
    return write_hf_qwen3(tmp_path_factory.mktemp("qwen3"), tie=tied, shard=tied, seed=int(tied))


def hf_model(directory: Path, device: torch.device, dtype: torch.dtype):
    model = transformers.Qwen3ForCausalLM.from_pretrained(directory, dtype=dtype, attn_implementation="eager")
    return model.to(device).eval()


def test_sharded_checkpoint_is_read_through_its_index(tmp_path: Path) -> None:
    directory = write_hf_qwen3(tmp_path, tie=True, layers=1, shard=True)
    shards = set(json.loads((directory / "model.safetensors.index.json").read_text())["weight_map"].values())
    assert len(shards) > 1
    assert weight_files(directory) == sorted(directory / s for s in shards)


def test_prefill_logits_and_captured_hidden_states(
    checkpoint: Path, device: torch.device, dtype: torch.dtype
) -> None:
    ours = load_target(checkpoint, device, dtype)
    ours.setup_caches(64, capture_layers=(2, 0))
    ref = hf_model(checkpoint, device, dtype)
    ids = torch.tensor([3, 17, 42, 8, 8, 91, 5, 60, 2, 33, 71], device=device)
    with torch.inference_mode():
        logits, hidden = ours(ids, torch.arange(len(ids), device=device), 0, None, TorchBackend())
        out = ref(ids[None], output_hidden_states=True)
    assert_close(logits, out.logits[0], dtype)
    # capture order follows target_layer_ids; layer i is HF hidden_states[i + 1]
    want = torch.cat([out.hidden_states[3][0], out.hidden_states[1][0]], dim=-1)
    assert_close(hidden, want, dtype, atol=1e-4, rtol=1e-4)


def test_tree_verify_equals_full_recompute_of_each_branch(
    checkpoint: Path, device: torch.device, dtype: torch.dtype
) -> None:
    """A tree pass after a cached context gives, at every node, the logits of context + its root path."""
    backend = TorchBackend()
    ours = load_target(checkpoint, device, dtype)
    ours.setup_caches(64)
    ref = hf_model(checkpoint, device, dtype)
    context = torch.tensor([11, 4, 58, 20, 9, 77], device=device)
    gen = torch.Generator().manual_seed(1)
    tokens, parents, depth = backend.build_tree(torch.randn(4, 97, generator=gen), 12, torch.tensor(30))
    tokens, parents, depth = tokens.to(device), parents.to(device), depth.to(device)
    start = len(context)
    with torch.inference_mode():
        ours(context, torch.arange(start, device=device), 0, None, backend, capture=False)
        logits, _ = ours(
            tokens,
            start + depth,
            start,
            ours.plan(parents, depth, backend, chain=False),
            backend,
            capture=False,
        )
        for i in range(len(tokens)):
            branch, j = [], i
            while j >= 0:
                branch.insert(0, int(tokens[j]))
                j = int(parents[j])
            seq = torch.cat([context, torch.tensor(branch, device=device)])
            want = ref(seq[None]).logits[0, -1].float()
            # a different summation order than one prefill: allow fp32 rounding relative to the logit
            assert_close(logits[i], want, dtype, rtol=1e-5)
