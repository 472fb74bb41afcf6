"""Our Qwen3.5 hybrid forward against transformers' Qwen3_5ForConditionalGeneration, on random
checkpoints written in the real layout (text_config, language_model prefix, shards, vision, mtp)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ddtree_runtime.backend import TorchBackend
from ddtree_runtime.loader import load_target
from ddtree_runtime.models.qwen3_5 import Qwen3_5
from tests.runtime.helpers import assert_close, write_hf_qwen3_5

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_hf_qwen3_5(tmp_path_factory.mktemp("qwen3_5"))


def hf_model(directory: Path, device: torch.device, dtype: torch.dtype):
    model = transformers.Qwen3_5ForConditionalGeneration.from_pretrained(
        directory, dtype=dtype, attn_implementation="eager"
    )
    return model.to(device).eval()


def test_checkpoint_is_in_the_real_layout(checkpoint: Path) -> None:
    raw = json.loads((checkpoint / "config.json").read_text())
    assert raw["model_type"] == "qwen3_5" and "text_config" in raw
    names = json.loads((checkpoint / "model.safetensors.index.json").read_text())["weight_map"]
    assert any(n.startswith("model.language_model.layers.0.linear_attn.") for n in names)
    assert any(n.startswith("model.visual.") for n in names) and "mtp.fc.weight" in names
    assert len(set(names.values())) > 2


def test_prefill_logits_and_captured_hidden_states(
    checkpoint: Path, device: torch.device, dtype: torch.dtype
) -> None:
    ours = load_target(checkpoint, device, dtype)
    assert isinstance(ours, Qwen3_5)
    assert ours.config.layer_types == ("linear_attention", "linear_attention", "full_attention") * 2
    ours.setup_caches(128, capture_layers=(4, 0, 5))
    ref = hf_model(checkpoint, device, dtype)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 97, (75,), generator=gen).to(device)  # > one 64-token chunk
    with torch.inference_mode():
        logits, hidden = ours(ids, torch.arange(len(ids), device=device), 0, None, TorchBackend())
        out = ref(input_ids=ids[None], output_hidden_states=True)
    assert_close(logits, out.logits[0], dtype, atol=1e-4, rtol=1e-4)
    want = torch.cat([out.hidden_states[5][0], out.hidden_states[1][0], out.hidden_states[6][0]], dim=-1)
    assert_close(hidden, want, dtype, atol=1e-4, rtol=1e-4)


def test_decode_after_prefill_matches_one_pass(
    checkpoint: Path, device: torch.device, dtype: torch.dtype
) -> None:
    """Prefill then token-by-token steps carry the conv and recurrent states exactly."""
    backend = TorchBackend()
    ours = load_target(checkpoint, device, dtype)
    ours.setup_caches(64)
    ids = torch.tensor([5, 9, 33, 2, 70, 41, 8, 19, 64, 3], device=device)
    with torch.inference_mode():
        full, _ = ours(ids, torch.arange(10, device=device), 0, None, backend, capture=False)
        ours(ids[:6], torch.arange(6, device=device), 0, None, backend, capture=False)
        steps = [
            ours(ids[i : i + 1], torch.tensor([i], device=device), i, None, backend, capture=False)[0]
            for i in range(6, 10)
        ]
    assert_close(torch.cat(steps), full[6:], dtype, atol=1e-4, rtol=1e-4)


def test_tree_verify_and_commit_equal_recompute_of_each_branch(
    checkpoint: Path, device: torch.device, dtype: torch.dtype
) -> None:
    """Every tree node's logits are those of context + its own root path; after `commit` of one
    branch the next token's logits are those of context + that branch."""
    backend = TorchBackend()
    ours = load_target(checkpoint, device, dtype)
    ours.setup_caches(64)
    ref = hf_model(checkpoint, device, dtype)
    context = torch.tensor([11, 4, 58, 20, 9, 77], device=device)
    gen = torch.Generator().manual_seed(1)
    tokens, parents, depth = backend.build_tree(torch.randn(5, 97, generator=gen), 14, torch.tensor(30))
    tokens, parents, depth = tokens.to(device), parents.to(device), depth.to(device)
    start = len(context)

    def branch(i: int) -> list[int]:
        path = []
        while i >= 0:
            path.insert(0, i)
            i = int(parents[i])
        return path

    with torch.inference_mode():
        ours(context, torch.arange(start, device=device), 0, None, backend, capture=False)
        tree = ours.plan(parents, depth, backend, chain=False)
        logits, _ = ours(tokens, start + depth, start, tree, backend, capture=False)
        for i in range(len(tokens)):
            seq = torch.cat([context, tokens[branch(i)]])
            assert_close(
                logits[i], ref(input_ids=seq[None]).logits[0, -1].float(), dtype, atol=1e-4, rtol=1e-4
            )
        deepest = int(depth.argmax())
        path = torch.full((len(tokens),), -1, device=device)
        nodes = branch(deepest)
        path[: len(nodes)] = torch.tensor(nodes, device=device)
        ours.commit(start, tree, path, torch.tensor(len(nodes), device=device), backend)
        after = start + len(nodes)
        nxt, _ = ours(
            torch.tensor([7], device=device),
            torch.tensor([after], device=device),
            after,
            None,
            backend,
            capture=False,
        )
        seq = torch.cat([context, tokens[nodes], torch.tensor([7], device=device)])
        want = ref(input_ids=seq[None]).logits[0, -1].float()
    assert_close(nxt[0], want, dtype, atol=1e-4, rtol=1e-4)
