"""Train the demo pair's small target LM from scratch on the Python standard library's sources.

Every machine with Python has that text offline, so the demo pair is regenerable anywhere with no
download. The tokenizer is a byte-level BPE trained on the same files; one file in ten (by a hash of
its path) is held out and supplies the evaluation prompts. The model is our own Qwen3 module, saved
in the Hugging Face layout the loader reads (bf16 weights, so the pair stays small in git).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import sysconfig
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from ddtree_runtime.backend import TorchBackend
from ddtree_runtime.config import Qwen3Config
from ddtree_runtime.models.qwen3 import Qwen3

EOS, MASK = "<|endoftext|>", "<|mask|>"


@dataclass(frozen=True)
class LMSpec:
    vocab: int = 2048
    hidden: int = 256
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    inner: int = 768
    seq_len: int = 128
    batch: int = 8
    steps: int = 400
    lr: float = 4e-3
    max_corpus_chars: int = 12_000_000
    seed: int = 0


def stdlib_files() -> list[Path]:
    """The standard library's `.py` sources, tests and vendored packages left out, in a fixed order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = ("test", "tests", "idle_test", "site-packages", "lib2to3", "__pycache__")
    return sorted(
        p for p in root.rglob("*.py") if not any(part in skip for part in p.relative_to(root).parts)
    )


def is_held_out(path: Path) -> bool:
    """One file in ten, by a stable hash of its name relative to the stdlib."""
    rel = path.relative_to(sysconfig.get_paths()["stdlib"]).as_posix()
    return hashlib.sha256(rel.encode()).digest()[0] % 10 == 0


def read_texts(files: list[Path], max_chars: int) -> list[str]:
    out, total = [], 0
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        out.append(text)
        total += len(text)
        if total >= max_chars:
            break
    return out


def train_tokenizer(texts: list[str], vocab: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=[EOS, MASK], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(texts, trainer)
    return tok


def target_config(spec: LMSpec, tok: Tokenizer) -> dict[str, object]:
    eos = tok.token_to_id(EOS)
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": tok.get_vocab_size(),
        "hidden_size": spec.hidden,
        "intermediate_size": spec.inner,
        "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.kv_heads,
        "head_dim": spec.hidden // spec.heads,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "hidden_act": "silu",
        "bos_token_id": eos,
        "eos_token_id": eos,
        "torch_dtype": "bfloat16",
    }


def save_target(model: Qwen3, raw: dict[str, object], tok: Tokenizer, out: Path) -> None:
    """HF layout: `model.*` names, tied head left out, bf16, tokenizer and configs beside."""
    out.mkdir(parents=True, exist_ok=True)
    state = {
        f"model.{k}": v.detach().to(torch.bfloat16).contiguous()
        for k, v in model.state_dict().items()
        if k != "lm_head.weight"
    }
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    tok.save(str(out / "tokenizer.json"))
    tok_cfg = {"eos_token": EOS, "bos_token": None, "pad_token": EOS, "model_max_length": 2048}
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n")
    gen_cfg = {"eos_token_id": raw["eos_token_id"], "do_sample": False}
    (out / "generation_config.json").write_text(json.dumps(gen_cfg, indent=2) + "\n")


def lm_loss(model: Qwen3, batch: torch.Tensor) -> torch.Tensor:
    """Mean next-token loss of each [T + 1] row through the model's own forward (fresh caches per
    row: autograd follows their in-place writes)."""
    losses = []
    for row in batch:
        model.setup_caches(row.shape[0] - 1)
        logits, _ = model(row[:-1], torch.arange(row.shape[0] - 1), 0, None, TorchBackend(), capture=False)
        losses.append(F.cross_entropy(logits, row[1:]))
    return torch.stack(losses).mean()


def train_lm(out: Path, spec: LMSpec, log=print) -> None:
    """Tokenizer, then `spec.steps` AdamW steps on random windows of the training stream."""
    torch.manual_seed(spec.seed)
    rng = random.Random(spec.seed)
    files = [f for f in stdlib_files() if not is_held_out(f)]
    rng.shuffle(files)
    texts = read_texts(files, spec.max_corpus_chars)
    tok = train_tokenizer(texts, spec.vocab)
    eos = tok.token_to_id(EOS)
    stream: list[int] = []
    for enc in tok.encode_batch(texts):
        stream.extend([*enc.ids, eos])
    data = torch.tensor(stream, dtype=torch.int64)
    log(f"corpus: {len(texts)} files, {len(data):,} tokens, vocab {tok.get_vocab_size()}")
    raw = target_config(spec, tok)
    model = Qwen3(Qwen3Config.from_dict(raw, out / "config.json"))
    model.lm_head.weight = model.embed_tokens.weight  # tied
    for name, p in model.named_parameters():
        if p.ndim == 2:
            torch.nn.init.normal_(p, std=0.02 if "embed" in name else p.shape[1] ** -0.5 * 0.5)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, betas=(0.9, 0.95), weight_decay=0.05)
    warmup = max(1, spec.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / spec.steps))),
    )
    t0 = time.perf_counter()
    for step in range(spec.steps):
        starts = torch.randint(0, len(data) - spec.seq_len - 1, (spec.batch,))
        batch = torch.stack([data[s : s + spec.seq_len + 1] for s in starts.tolist()])
        loss = lm_loss(model, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 25 == 0 or step == spec.steps - 1:
            el = time.perf_counter() - t0
            log(
                f"step {step}/{spec.steps} loss {loss.item():.3f} {el:.0f}s eta {el / (step + 1) * (spec.steps - step - 1):.0f}s"
            )
    save_target(model, raw, tok, out)
    (out / "train_spec.json").write_text(json.dumps(asdict(spec), indent=2) + "\n")
