"""A Qwen3.6-27B-shaped hybrid target with random weights, built on the GPU: one `ar` step, one
verify pass over a DDTree tree (B = 256: 257 tokens) and its commit, after a cached context.

All 64 layers (48 Gated DeltaNet + 16 gated full attention), hidden 5120, bf16, random weights
(nothing is downloaded). Prints one JSON object with median ms per phase and the verify / ar
ratio; the weight bytes read per pass are in it too, for the roofline.

    python benchmarks/hybrid_verify_bench.py [--budget 256] [--context 2048] [--layers 64]
    python benchmarks/hybrid_verify_bench.py --fp8 block  # an FP8 target (Qwen's block format)
    python benchmarks/hybrid_verify_bench.py --small --device cpu --dtype float32  # smoke test
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.fp8_bench import quantize_linears
from benchmarks.gdn_tree_bench import timed_us
from ddtree_runtime.backend import select_backend
from ddtree_runtime.config import Qwen3_5Config
from ddtree_runtime.models.qwen3_5 import Qwen3_5

QWEN36_27B = {
    "model_type": "qwen3_5_text", "vocab_size": 248320, "hidden_size": 5120, "intermediate_size": 17408,
    "num_hidden_layers": 64, "full_attention_interval": 4, "num_attention_heads": 24,
    "num_key_value_heads": 4, "head_dim": 256, "linear_num_key_heads": 16, "linear_num_value_heads": 48,
    "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25},
    "max_position_embeddings": 262144, "rms_norm_eps": 1e-6,
}  # fmt: skip
SMALL = {**QWEN36_27B, "vocab_size": 1000, "hidden_size": 128, "intermediate_size": 256,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "linear_num_key_heads": 2,
         "linear_num_value_heads": 4, "linear_key_head_dim": 32, "linear_value_head_dim": 32}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--layers", type=int, default=64)
    p.add_argument("--budget", type=int, default=256)
    p.add_argument("--depth", type=int, default=15)
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--small", action="store_true", help="tiny widths, for a CPU smoke run")
    p.add_argument("--fp8", choices=["block", "channel"], help="quantize the projections (an FP8 target)")
    args = p.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    raw = {**(SMALL if args.small else QWEN36_27B), "num_hidden_layers": args.layers}
    cfg = Qwen3_5Config.from_dict(raw, Path("<qwen3.6-27b-shaped>"))
    torch.manual_seed(0)
    with torch.device("meta"):
        model = Qwen3_5(cfg)
    model = model.to_empty(device=device).to(dtype)
    with torch.no_grad():
        for name, w in model.named_parameters():
            if name.endswith("norm.weight"):
                w.zero_() if "linear_attn" not in name else w.fill_(1.0)
            elif name.endswith(("A_log", "dt_bias")):
                w.uniform_(-1.0, 0.0)
            else:
                w.normal_(0.0, (w.shape[-1] if w.ndim > 1 else 1) ** -0.5)
    model.eval()
    if args.fp8:
        quantize_linears(model, args.fp8)
    backend = select_backend(device)
    model.setup_caches(args.context + args.budget + 2)
    gen = torch.Generator().manual_seed(1)
    context = torch.randint(0, cfg.vocab_size, (args.context,), generator=gen).to(device)
    # a DDTree-like tree: a main chain `depth` deep, the rest hung off the first levels
    parents = [-1, *range(min(args.budget, args.depth))]
    while len(parents) < args.budget + 1:
        parents.append(int(torch.randint(0, len(parents), (1,), generator=gen)) // 3)
    parents_t = torch.tensor(parents, device=device)
    depth = torch.zeros(len(parents), dtype=torch.int64)
    for i in range(1, len(parents)):
        depth[i] = depth[parents[i]] + 1
    depth = depth.to(device)
    tokens = torch.randint(0, cfg.vocab_size, (len(parents),), generator=gen).to(device)
    start = args.context
    path = torch.full_like(parents_t, -1)
    path[: args.depth + 1] = torch.arange(args.depth + 1, device=device)
    path_len = torch.tensor(args.depth + 1, device=device)

    with torch.inference_mode():
        prefill = 1e-3 * timed_us(lambda: model(context, torch.arange(start, device=device), 0, None, backend,
                                          capture=False), device, 1)  # fmt: skip
        conv, rec = model.conv_state.clone(), model.rec_state.clone()

        def ar_step() -> None:
            model(tokens[:1], torch.tensor([start], device=device), start, None, backend, capture=False)
            model.conv_state.copy_(conv)  # stay at the same context
            model.rec_state.copy_(rec)

        vis = backend.tree_visibility(parents_t, depth)

        def verify() -> None:
            model(tokens, start + depth, start, vis, backend, capture=False, parents=parents_t)

        def verify_commit() -> None:
            verify()
            model.commit(start, path, path_len, backend, chain=False)
            model.conv_state.copy_(conv)
            model.rec_state.copy_(rec)

        ar = 1e-3 * timed_us(ar_step, device, args.reps)
        ver = 1e-3 * timed_us(verify, device, args.reps)
        ver_commit = 1e-3 * timed_us(verify_commit, device, args.reps)
    weight_bytes = sum(w.numel() * w.element_size() for w in model.parameters())
    print(json.dumps({
        "model": "qwen3.6-27b-shaped" if not args.small else "small", "layers": args.layers, "fp8": args.fp8,
        "device": str(device), "dtype": args.dtype, "backend": backend.name, "context": args.context,
        "tree_tokens": len(parents), "prefill_ms": round(prefill, 2), "ar_step_ms": round(ar, 3),
        "verify_ms": round(ver, 3), "verify_commit_ms": round(ver_commit, 3),
        "verify_over_ar": round(ver / ar, 3), "weight_bytes": weight_bytes,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
