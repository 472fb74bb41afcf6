"""A tiny, real checkpoint pair: a Qwen3 target and a DFlash drafter fitted to it on the CPU.

Tests and the local demo deployment need a pair whose drafts the target actually accepts, with no
download. The target is a random Qwen3 with logits large enough to have clear argmaxes (so bf16
greedy runs stay comparable); the drafter is fitted for a few hundred steps to the target's own
greedy continuations, so multi-token acceptance paths occur end to end. Both are written in the
Hugging Face / z-lab formats the loader reads, with a word-level `tokenizer.json` and a chat template.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from tokenizers import Tokenizer, models, pre_tokenizers

from ddtree_runtime.config import DFlashConfig, Qwen3Config
from ddtree_runtime.engine import Engine
from ddtree_runtime.models.dflash import DFlashDrafter
from ddtree_runtime.models.qwen3 import Qwen3

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>", "<unk>")
WORDS = [
    "user",
    "assistant",
    "system",
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "was",
    "for",
    "on",
    "that",
    "with",
    "as",
    "by",
    "at",
    "from",
    "his",
    "her",
    "an",
    "were",
    "are",
    "which",
    "this",
    "be",
    "or",
    "had",
    "not",
    "but",
    "first",
    "one",
    "new",
    "after",
    "also",
    "who",
    "two",
    "has",
    "their",
    "have",
    "its",
    "into",
    "been",
    "time",
    "other",
    "city",
    "over",
    "when",
    "there",
    "all",
    "may",
    "about",
    "school",
    "year",
    "state",
    "some",
    "three",
    "would",
    "can",
    "during",
    "most",
    "world",
    "made",
    "war",
    "while",
    "up",
    "where",
    "before",
    "only",
]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass(frozen=True)
class TinyPair:
    target: Path
    drafter: Path


def tiny_tokenizer(n_words: int) -> Tokenizer:
    """Word-level tokenizer: the special tokens first (ids 0..4), then `n_words` words."""
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    words = [*WORDS, *(f"w{i}" for i in range(max(0, n_words - len(WORDS))))][:n_words]
    vocab.update({w: len(SPECIALS) + i for i, w in enumerate(words)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(list(SPECIALS))
    return tok


def _target_config(vocab: int, hidden: int, layers: int) -> dict[str, object]:
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": hidden // 4,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "hidden_act": "silu",
        "bos_token_id": SPECIALS.index("<|endoftext|>"),
        "eos_token_id": [SPECIALS.index("<|im_end|>"), SPECIALS.index("<|endoftext|>")],
        "torch_dtype": "float32",
    }


def _drafter_config(
    target: dict[str, object], layers: int, block_size: int, layer_ids: list[int], layer_types: list[str]
) -> dict[str, object]:
    cfg = {k: v for k, v in target.items() if k not in ("architectures", "eos_token_id", "bos_token_id")}
    cfg.update(
        {
            "architectures": ["DFlashDraftModel"],
            "num_hidden_layers": layers,
            "num_target_layers": target["num_hidden_layers"],
            "block_size": block_size,
            "dflash_config": {"mask_token_id": SPECIALS.index("<|mask|>"), "target_layer_ids": layer_ids},
            "layer_types": layer_types,
        }
    )
    if "sliding_attention" in layer_types:
        cfg.update(use_sliding_window=True, sliding_window=max(8, block_size))
    return cfg


def _init_target(model: Qwen3, gen: torch.Generator, logit_scale: float) -> None:
    """A random Qwen3 whose greedy choice mostly follows a fixed cycle through the words.

    Unit-variance weights make the context matter; the LM head adds a strong "successor" term
    (word c points at the word after it on a random cycle) so that greedy text walks the whole
    vocabulary instead of collapsing into one repeated token, and a drafter can learn it quickly.
    Special tokens get zero logits, so they are never the argmax.
    """
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            continue
        std = 1.0 if p.ndim == 1 or name == "embed_tokens.weight" else p.shape[1] ** -0.5
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            std *= 0.5
        with torch.no_grad():
            p.copy_(torch.randn(p.shape, generator=gen) * std)
    n_special, vocab = len(SPECIALS), model.config.vocab_size
    order = (torch.randperm(vocab - n_special, generator=gen) + n_special).tolist()
    with torch.no_grad():
        emb = F.normalize(model.embed_tokens.weight, dim=-1) * model.config.hidden_size**0.5
        head = model.lm_head.weight
        head.mul_(0.5)
        for a, b in zip(order, order[1:] + order[:1], strict=True):
            head[b] += emb[a] * model.config.hidden_size**-0.5
        head.mul_(logit_scale)
        head[:n_special] = 0.0


def _fit_drafter(target: Qwen3, drafter: DFlashDrafter, steps: int, seed: int, n_words: int) -> None:
    """Fit the drafter to predict the target's greedy continuation of random prompts."""
    if steps == 0:
        return
    rng = random.Random(seed)
    block = drafter.config.block_size
    target.requires_grad_(False)
    engine = Engine(target, None, max_context=128)
    seqs = []
    for _ in range(48):
        prompt = [len(SPECIALS) + rng.randrange(n_words) for _ in range(rng.randint(2, 8))]
        out = engine.generate(prompt, mode="ar", max_new_tokens=40, eos_ids=())
        seqs.append((torch.tensor(prompt + out.output_ids), len(prompt)))
    target.setup_caches(128, drafter.config.target_layer_ids)
    data = []
    with torch.no_grad():  # not inference_mode: the features feed a graph that needs grads
        for seq, p in seqs:
            _, hidden = target(seq, torch.arange(len(seq)), 0, None, engine.backend)
            data.append((seq, hidden, p))
    embed, head = target.embed_tokens.weight.detach(), target.lm_head
    mask = torch.tensor([drafter.config.mask_token_id] * (block - 1))
    drafter.train()
    opt = torch.optim.AdamW(drafter.parameters(), lr=3e-3, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 - s / max(1, steps))
    for _ in range(steps):
        opt.zero_grad()
        for _ in range(4):
            seq, hidden, p = data[rng.randrange(len(data))]
            s = rng.randrange(p, len(seq) - block + 1)
            drafter.setup_caches(s + block)
            noise = F.embedding(torch.cat([seq[s : s + 1], mask]), embed)
            logits = drafter.logits(drafter(hidden[:s], 0, noise)[1:], head)
            F.cross_entropy(logits, seq[s + 1 : s + block]).backward()
        opt.step()
        sched.step()
    drafter.eval()
    for p in drafter.parameters():
        p.requires_grad_(False)


def write_tiny_pair(
    directory: str | Path,
    *,
    n_words: int = 64,
    hidden: int = 64,
    target_layers: int = 4,
    drafter_layers: int = 2,
    block_size: int = 6,
    layer_types: list[str] | None = None,
    fit_steps: int = 240,
    logit_scale: float = 4.0,
    seed: int = 0,
) -> TinyPair:
    """Write `target/` and `drafter/` under `directory` (reused when already complete)."""
    pair, gen = _start_pair(directory, seed)
    if gen is None:
        return pair
    vocab = len(SPECIALS) + n_words

    target_raw = _target_config(vocab, hidden, target_layers)
    target = Qwen3(Qwen3Config.from_dict(target_raw, pair.target / "config.json"))
    _init_target(target, gen, logit_scale)
    types = layer_types or ["full_attention"] * drafter_layers
    _write_fitted_drafter(
        target, target_raw, pair.drafter, drafter_layers, types, block_size, fit_steps, seed, n_words
    )

    state = {f"model.{k}": v.contiguous() for k, v in target.state_dict().items() if k != "lm_head.weight"}
    state["lm_head.weight"] = target.lm_head.weight.contiguous()
    save_file(state, str(pair.target / "model.safetensors"), metadata={"format": "pt"})
    _finish_pair(pair, target_raw, target_raw["eos_token_id"], n_words)
    return pair


def _start_pair(directory: str | Path, seed: int) -> tuple[TinyPair, torch.Generator | None]:
    """The pair's folders under `directory`, made, and a generator seeded (torch's global seed too)
    for a fresh write; None instead of the generator when a complete pair is there (nothing seeded)."""
    root = Path(directory)
    pair = TinyPair(root / "target", root / "drafter")
    if (root / "DONE").exists():
        return pair, None
    pair.target.mkdir(parents=True, exist_ok=True)
    pair.drafter.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    return pair, torch.Generator().manual_seed(seed)


def _write_fitted_drafter(
    target: Qwen3,
    dense_raw: dict[str, object],
    directory: Path,
    layers: int,
    layer_types: list[str],
    block_size: int,
    fit_steps: int,
    seed: int,
    n_words: int,
) -> None:
    """A drafter with the layer shapes of the dense config `dense_raw`, reading target layers
    [1, L - 2] (the middle one for a single layer), fitted to `target` and written to `directory`."""
    target_layers = dense_raw["num_hidden_layers"]
    layer_ids = [1, target_layers - 2] if layers > 1 else [target_layers // 2]
    raw = _drafter_config(dense_raw, layers, block_size, layer_ids, layer_types)
    drafter = DFlashDrafter(DFlashConfig.from_dict(raw, directory / "config.json"))
    _fit_single_threaded(target, drafter, fit_steps, seed, n_words)
    _write_drafter(drafter, raw, directory)


def _finish_pair(pair: TinyPair, target_raw: dict[str, object], eos_ids: object, n_words: int) -> None:
    """The target's config and tokenizer files, then the `DONE` mark that makes the pair reusable."""
    (pair.target / "config.json").write_text(json.dumps(target_raw, indent=2))
    _write_tokenizer(pair.target, n_words, eos_ids)
    (pair.target.parent / "DONE").write_text("ok\n")


def _fit_single_threaded(target: Qwen3, drafter: DFlashDrafter, steps: int, seed: int, n_words: int) -> None:
    """`_fit_drafter` on one thread: for tiny matmuls extra threads only add contention."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _fit_drafter(target, drafter, steps, seed, n_words)
    finally:
        torch.set_num_threads(threads)


def _write_drafter(drafter: DFlashDrafter, raw: dict[str, object], directory: Path) -> None:
    """The drafter's weights and config in z-lab's format."""
    save_file(
        {k: v.contiguous() for k, v in drafter.state_dict().items()},
        str(directory / "model.safetensors"),
        metadata={"format": "pt"},
    )
    (directory / "config.json").write_text(json.dumps(raw, indent=2))


def _write_tokenizer(directory: Path, n_words: int, eos_ids: object) -> None:
    """`tokenizer.json`, `tokenizer_config.json` (with the chat template) and `generation_config.json`."""
    tiny_tokenizer(n_words).save(str(directory / "tokenizer.json"))
    tok_cfg = {
        "chat_template": CHAT_TEMPLATE,
        "eos_token": "<|im_end|>",
        "bos_token": None,
        "pad_token": "<|endoftext|>",
        "model_max_length": 4096,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2))
    gen_cfg = {"eos_token_id": eos_ids, "do_sample": False}
    (directory / "generation_config.json").write_text(json.dumps(gen_cfg, indent=2))
