"""Hardware floors of a decoding round, and the measured per-phase split it is compared with.

A pass of a target over T new rows at a context of C rows must at least read every weight once, the
attention layers' KV cache once and (a hybrid) every Gated DeltaNet state once and write it back
(bytes), and do the weight matmuls, the attention and the recurrence (FLOPs):

    bytes = weights + L_attn * 2 * Hkv * D * (C + T) * elem + L_gdn * 2 * Hv * Dk * Dv * 4
    flops = 2 * T * matmul_params + L_attn * 4 * Hq * T * (C + T) * D + L_gdn * 6 * T * Hv * Dk * Dv
    floor = max(bytes / copy_bandwidth, flops / matmul_rate)

with the two ceilings measured on the machine itself (`measure_ceilings`: a large device copy, a
large bf16 matmul). A round's floor is its passes' floors added up: `ar` one target pass of one row;
`dflash`/`ddtree` a drafter pass (its layers, and the target's LM head for B - 1 rows) plus a
target pass over the verified rows. Everything else (tree build, walk, compaction, the host) is
overhead against that floor. (The recurrence's count is its chain form's; a tree's extra
intra-tree products are smaller than the matmuls' by orders of magnitude.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ddtree_runtime.config import DFlashConfig, Qwen3_5Config, Qwen3Config
from ddtree_runtime.engine import Engine
from ddtree_runtime.graphs import key_bound
from ddtree_runtime.quant import Fp8Linear
from ddtree_runtime.rounds import Sampling
from specops_contract import verify_rows


@dataclass(frozen=True)
class Ceilings:
    copy_bytes_per_s: float  # bytes read + written per second by a large device copy
    matmul_flops_per_s: float  # a large matmul in the model's dtype

    def floor_s(self, nbytes: float, flops: float) -> float:
        return max(nbytes / self.copy_bytes_per_s, flops / self.matmul_flops_per_s)


def measure_ceilings(device: torch.device, dtype: torch.dtype = torch.bfloat16) -> Ceilings:
    """Median of repeated timings of a 2 GiB copy and an 8192^3 matmul on random data."""
    from triton.testing import do_bench

    src = torch.randn(1 << 30, device=device, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    copy_s = do_bench(lambda: dst.copy_(src), warmup=50, rep=300, return_mode="median") / 1e3
    n = 8192
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    mm_s = do_bench(lambda: a @ b, warmup=50, rep=300, return_mode="median") / 1e3
    return Ceilings(2 * (1 << 30) * 2 / copy_s, 2 * n**3 / mm_s)


def matmul_params(cfg: Qwen3Config | Qwen3_5Config) -> int:
    """Weights one row multiplies through in the decoder layers (no embedding, no LM head)."""
    d, h, mlp = cfg.head_dim, cfg.hidden_size, 3 * cfg.hidden_size * cfg.intermediate_size
    if isinstance(cfg, Qwen3Config):
        attn = h * d * (cfg.num_attention_heads * 2 + cfg.num_key_value_heads * 2)
        return cfg.num_hidden_layers * (attn + mlp)
    # gated attention: q and its gate, k, v, o; Gated DeltaNet: [mixed | z | b | a] in, out
    attn = h * d * (cfg.num_attention_heads * 3 + cfg.num_key_value_heads * 2)
    value = cfg.linear_num_value_heads * cfg.linear_value_head_dim
    mixed = 2 * cfg.linear_num_key_heads * cfg.linear_key_head_dim + value
    gdn = h * (mixed + value + 2 * cfg.linear_num_value_heads) + value * h
    return len(cfg.full_layers) * (attn + mlp) + len(cfg.linear_layers) * (gdn + mlp)


def _attention_layers(cfg: Qwen3Config | Qwen3_5Config) -> int:
    return cfg.num_hidden_layers if isinstance(cfg, Qwen3Config) else len(cfg.full_layers)


def _state_elems(cfg: Qwen3Config | Qwen3_5Config) -> int:
    """Recurrent-state values of all Gated DeltaNet layers (fp32; none in a dense model)."""
    if isinstance(cfg, Qwen3Config):
        return 0
    return (
        len(cfg.linear_layers)
        * cfg.linear_num_value_heads
        * cfg.linear_key_head_dim
        * cfg.linear_value_head_dim
    )


def pass_cost(
    cfg: Qwen3Config | Qwen3_5Config, rows: int, context: int, head_rows: int, elem: int = 2
) -> tuple[float, float]:
    """(bytes, flops) of one pass over `rows` new rows at `context`, `head_rows` of them through
    the LM head (the embedding lookup reads `rows` rows of it)."""
    head = cfg.vocab_size * cfg.hidden_size
    keys = context + rows
    kv = _attention_layers(cfg) * 2 * cfg.num_key_value_heads * cfg.head_dim * keys
    state = _state_elems(cfg)
    nbytes = (
        matmul_params(cfg) + (head if head_rows else 0) + rows * cfg.hidden_size + kv
    ) * elem + 2 * 4 * state
    attn = _attention_layers(cfg) * 4 * cfg.num_attention_heads * rows * keys * cfg.head_dim
    flops = 2 * rows * matmul_params(cfg) + 2 * head_rows * head + attn + 6 * rows * state
    return nbytes, flops


def head_elem(engine: Engine) -> int:
    """Bytes per weight of the head the engine's drafts go through: 1 for an FP8 head, else the 2
    that the floors count for every weight (an fp32 test model included)."""
    return 1 if isinstance(engine.draft_head, Fp8Linear) else 2


def round_floor_s(
    ceil: Ceilings,
    target: Qwen3Config | Qwen3_5Config,
    drafter: DFlashConfig | None,
    mode: str,
    budget: int,
    context: int,
    head_bytes: int,
) -> dict[str, float]:
    """The floor of one round at `context`, split into its target and drafter passes; the drafts
    go through an LM head of `head_bytes` bytes a weight (`head_elem`: 1 for the FP8 copy)."""
    if mode == "ar":
        return {"target": ceil.floor_s(*pass_cost(target, 1, context, 1)), "drafter": 0.0}
    assert drafter is not None
    block = drafter.block_size
    rows = block if mode == "dflash" else budget + 1
    verify = ceil.floor_s(*pass_cost(target, rows, context, rows))
    lc = drafter.layers
    d_bytes, d_flops = pass_cost(lc, block, 0, 0)  # the layers over the block itself
    for window in drafter.windows:  # ... and the context keys each layer sees (sliding: its window)
        keys = context if window is None else min(context, window)
        d_bytes += 2 * lc.num_key_value_heads * lc.head_dim * keys * 2
        d_flops += 4 * lc.num_attention_heads * block * keys * lc.head_dim
    head = target.vocab_size * target.hidden_size  # the target's LM head for the B - 1 drafts
    fc = len(drafter.target_layer_ids) * lc.hidden_size * lc.hidden_size
    draft = ceil.floor_s(
        d_bytes + head * head_bytes + fc * 2, d_flops + 2 * (block - 1) * head + 2 * block * fc
    )
    return {"target": verify, "drafter": draft}


@torch.inference_mode()
def phase_times_s(engine: Engine, mode: str, budget: int, reps: int = 20) -> dict[str, float]:
    """Median GPU time of each phase of a greedy round, each phase captured as its own CUDA graph
    and replayed `reps` times (the engine must hold a prefilled context: call after `generate`)."""
    buf = engine.buffers
    rows = verify_rows(mode, buf.feats.shape[0], budget)
    bound = key_bound(int(buf.ctx) + rows, engine.max_context, bucketed=True)  # as the round's own
    phases = engine._phases(mode, budget, bound, Sampling())
    restore_buffers, restore_target = buf.snapshot(), engine.target.snapshot()

    def reset() -> None:
        restore_buffers()
        restore_target()

    for _, run in phases:  # compile and allocate outside the capture
        run()
    reset()
    graphs = []
    for _, run in phases:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            run()
        graphs.append(graph)
    times: dict[str, list[float]] = {name: [] for name, _ in phases}
    for _ in range(reps):
        reset()
        for (name, _), graph in zip(phases, graphs, strict=True):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end) / 1e3)
    reset()
    return {name: sorted(ts)[len(ts) // 2] for name, ts in times.items()}
