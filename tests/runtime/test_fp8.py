"""FP8 targets (Qwen's block-wise FP8 and compressed-tensors FP8_DYNAMIC, dense and hybrid tiny
checkpoints): every mode gives the `ar` tokens of the same FP8 model at T = 0, the forward is the
checkpoint's (transformers dequantizes the block format exactly as we do; our W8A8 logits stay within
the activation quantization's error of the dequantized model), and anything else is refused at load
with the field named."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from ddtree_runtime.backend import TorchBackend
from ddtree_runtime.config import ConfigError
from ddtree_runtime.engine import Engine
from ddtree_runtime.fp8 import dequantize_weight
from ddtree_runtime.loader import load_target
from ddtree_runtime.quant import Fp8Linear
from ddtree_runtime.tiny import SPECIALS, TinyPair
from ddtree_runtime.tiny_fp8 import write_fp8_pair
from tests.runtime.helpers import assert_same_tokens, engine_for

KINDS = ["dense-block", "dense-channel", "hybrid-block", "hybrid-channel"]
# e4m3 activations keep 3 mantissa bits (a rounding error up to 2^-4 per element): against the
# same weights without activation quantization the logits move by 2.5% of their norm in the dense
# tiny target and 7% in the hybrid (whose loud, slowly decaying DeltaNet state carries the error on)
ACTIVATION_TOLERANCE = 0.1
# the scale blocks after fusion: the tiny q/k/v (64/32/32 rows) are no whole 128-row blocks, so the
# fused qkv of the dense target keeps one scale per row; per-channel scales are (1, K)
BLOCKS = {
    "dense-block": {(128, 128), (1, 128)},
    "hybrid-block": {(128, 128)},
    "dense-channel": {(1, 64), (1, 128)},
    "hybrid-channel": {(1, 64), (1, 128)},
}


@pytest.fixture(scope="module")
def fp8_pairs(tiny_pair: TinyPair, hybrid_pair: TinyPair, tmp_path_factory) -> dict[str, TinyPair]:
    root = tmp_path_factory.mktemp("fp8")
    sources = {"dense": tiny_pair, "hybrid": hybrid_pair}
    return {
        kind: write_fp8_pair(sources[kind.split("-")[0]], root / kind, kind.split("-")[1]) for kind in KINDS
    }


@pytest.fixture(scope="module")
def engines(fp8_pairs, device, dtype) -> dict[str, Engine]:
    return {kind: engine_for(pair, device, dtype) for kind, pair in fp8_pairs.items()}


def prompts(seed: int, count: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[len(SPECIALS) + rng.randrange(64) for _ in range(rng.randint(1, 10))] for _ in range(count)]


def test_the_target_keeps_its_fp8_weights_and_the_drafter_its_dtype(engines, dtype) -> None:
    for kind, engine in engines.items():
        fp8 = [m for m in engine.target.modules() if isinstance(m, Fp8Linear)]
        assert len(fp8) == 16, kind  # 4 a layer, fused (qkv | [mixed | z] | gate_up, and the outputs)
        assert all(m.weight.dtype == torch.float8_e4m3fn and m.scale.dtype == torch.float32 for m in fp8)
        # the tiny hybrid's [mixed | z] is not whole 128-row blocks: fused, its scales go per row
        assert {m.block for m in fp8} == BLOCKS[kind] | ({(1, 128)} if kind == "hybrid-block" else set())
        head, embed = engine.target.lm_head, engine.target.embed_tokens
        assert not isinstance(head, Fp8Linear) and head.weight.dtype == embed.weight.dtype == dtype
        assert {p.dtype for p in engine.drafter.parameters()} == {dtype}
    layer = engines["hybrid-block"].target.layers[0].linear_attn
    assert isinstance(layer.in_proj, Fp8Linear) and not isinstance(
        layer.in_proj_gates, Fp8Linear
    )  # b, a in bf16


@pytest.mark.parametrize("kind", KINDS)
def test_speculative_modes_give_the_ar_tokens(engines, kind: str, dtype: torch.dtype) -> None:
    engine, accepted = engines[kind], 0.0
    for prompt in prompts(KINDS.index(kind), 3):
        want = engine.generate(prompt, mode="ar", max_new_tokens=32).output_ids
        got = engine.generate(prompt, mode="dflash", max_new_tokens=32)
        assert_same_tokens(engine, prompt, want, got.output_ids, dtype)
        for budget in (1, 7, 64):
            got = engine.generate(prompt, mode="ddtree", budget=budget, max_new_tokens=32)
            assert_same_tokens(engine, prompt, want, got.output_ids, dtype)
            accepted = max(accepted, got.mean_accepted)
    assert accepted > 2.0  # the bf16-fitted drafter's drafts are still accepted by the FP8 target


def _dequantized_twin(target: Path, directory: Path) -> Path:
    """The FP8 checkpoint with every e4m3 weight replaced by its fp32 dequantization, unquantized."""
    shutil.copytree(target, directory, ignore=shutil.ignore_patterns("*.safetensors"))
    config = json.loads((target / "config.json").read_text())
    scheme = config.pop("quantization_config")
    block = tuple(scheme["weight_block_size"]) if scheme["quant_method"] == "fp8" else None
    tensors = load_file(str(target / "model.safetensors"))
    for name in [n for n, t in tensors.items() if t.dtype == torch.float8_e4m3fn]:
        stem = name.removesuffix(".weight")
        scale = tensors.pop(f"{stem}.weight_scale_inv" if block else f"{stem}.weight_scale").float()
        tensors[name] = dequantize_weight(tensors[name], scale, block or (1, tensors[name].shape[1]))
    save_file(tensors, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def _logits(directory: Path, ids: torch.Tensor) -> torch.Tensor:
    model = load_target(directory, torch.device("cpu"), torch.float32)
    model.setup_caches(64)
    with torch.inference_mode():
        return model(ids, torch.arange(len(ids)), 0, None, TorchBackend())[0]


@pytest.mark.parametrize("kind", KINDS)
def test_the_forward_is_the_dequantized_model_up_to_activation_quantization(
    fp8_pairs, kind: str, tmp_path: Path
) -> None:
    ids = torch.tensor(prompts(40, 1)[0] + list(range(10, 30)))
    ours = _logits(fp8_pairs[kind].target, ids)
    reference = _logits(_dequantized_twin(fp8_pairs[kind].target, tmp_path / "twin"), ids)
    rel = float((ours - reference).norm() / reference.norm())
    assert 1e-4 < rel < ACTIVATION_TOLERANCE, rel  # activations are quantized, and only that differs
    assert (ours.argmax(-1) == reference.argmax(-1)).float().mean() >= 0.9


def test_transformers_reads_the_block_checkpoint_as_we_do(fp8_pairs, tmp_path: Path) -> None:
    """transformers runs the FP8 checkpoint on a CPU by dequantizing it (no activation quantization):
    its weights are ours bit for bit and its logits those of our dequantized twin. Dequantizing is asked
    for: on a machine with a GPU transformers would keep the e4m3 weights, which its CPU forward cannot take."""
    transformers = pytest.importorskip("transformers")
    target = fp8_pairs["dense-block"].target
    quant = json.loads((target / "config.json").read_text())["quantization_config"]
    dequantized = transformers.FineGrainedFP8Config(
        weight_block_size=quant["weight_block_size"],
        modules_to_not_convert=quant["modules_to_not_convert"],
        dequantize=True,
    )
    hf = transformers.Qwen3ForCausalLM.from_pretrained(
        target, dtype=torch.float32, quantization_config=dequantized
    ).eval()
    ours = load_target(target, torch.device("cpu"), torch.float32)
    for i, layer in enumerate(ours.layers):
        qkv, hf_attn = layer.self_attn.qkv_proj, hf.model.layers[i].self_attn
        want = torch.cat([hf_attn.q_proj.weight, hf_attn.k_proj.weight, hf_attn.v_proj.weight])
        assert torch.equal(dequantize_weight(qkv.weight, qkv.scale, qkv.block), want)
        down = layer.mlp.down_proj
        assert torch.equal(
            dequantize_weight(down.weight, down.scale, down.block), hf.model.layers[i].mlp.down_proj.weight
        )
    ids = torch.tensor(prompts(41, 1)[0] + list(range(10, 30)))
    with torch.inference_mode():
        hf_logits = hf(ids[None]).logits[0]
    twin = _logits(_dequantized_twin(target, tmp_path / "twin"), ids)
    torch.testing.assert_close(twin, hf_logits, atol=1e-4, rtol=0.0)
    ours_logits = _logits(target, ids)
    assert float((ours_logits - hf_logits).norm() / hf_logits.norm()) < ACTIVATION_TOLERANCE


def _edited(target: Path, directory: Path, quant: dict | None = None, drop: str | None = None) -> Path:
    shutil.copytree(target, directory)
    config = json.loads((directory / "config.json").read_text())
    if quant is None:
        config.pop("quantization_config")
    else:
        config["quantization_config"] = {**config["quantization_config"], **quant}
    (directory / "config.json").write_text(json.dumps(config))
    if drop is not None:
        tensors = load_file(str(directory / "model.safetensors"))
        del tensors[drop]
        save_file(tensors, str(directory / "model.safetensors"))
    return directory


@pytest.mark.parametrize(
    ("kind", "quant", "drop", "match"),
    [
        (
            "dense-block",
            {"quant_method": "awq"},
            None,
            r"quantization_config\.quant_method: quant_method 'awq'",
        ),
        ("dense-block", {"fmt": "e5m2"}, None, r"quantization_config\.fmt: fmt is 'e5m2'"),
        ("dense-block", {"activation_scheme": "static"}, None, r"quantization_config\.activation_scheme"),
        ("dense-block", {"weight_block_size": [64, 64]}, None, r"weight_scale_inv has shape \[1, 1\]"),
        (
            "dense-channel",
            {"kv_cache_scheme": {"num_bits": 8}},
            None,
            r"quantization_config\.kv_cache_scheme",
        ),
        ("dense-block", None, None, "is stored in float8 but config.json has no quantization_config"),
        (
            "hybrid-block",
            {},
            "model.language_model.layers.0.linear_attn.out_proj.weight_scale_inv",
            r"layers\.0\.linear_attn\.out_proj\.weight_scale_inv is missing",
        ),
    ],
    ids=["awq", "e5m2", "static", "block-size", "fp8-kv-cache", "no-config", "no-scale"],
)
def test_what_we_cannot_serve_is_refused_at_load(fp8_pairs, tmp_path, kind, quant, drop, match) -> None:
    directory = _edited(fp8_pairs[kind].target, tmp_path / "target", quant, drop)
    with pytest.raises(ConfigError, match=match) as info:
        load_target(directory, torch.device("cpu"), torch.float32)
    assert "\n" not in str(info.value) and "(fix: " in str(info.value)
