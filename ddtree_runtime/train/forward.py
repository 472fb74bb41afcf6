"""Training-time forwards over our runtime modules: a batched causal target pass and a DFlash pass
that drafts many blocks of one sequence at once.

The runtime's `forward`s decode one request through static caches; training wants whole sequences
and gradients. These functions reuse the same parameters (so a trained drafter is served unchanged)
and are checked against the runtime forwards in the tests.

DFlash training (the z-lab recipe): pick anchors `a` in the response; block `a` is
`[x_a, MASK x (B - 1)]` at positions `a .. a + B - 1` and predicts `x_{a+1} .. x_{a+B-1}`. Its rows see
the context features of positions `< a` (the target's hidden states, as at inference, where the
drafter has read every committed row before the root) and the rows of their own block, subject to
each layer's causal/sliding rule. Blocks never see each other, so K blocks cost one pass.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ddtree_runtime.models.dflash import DFlashDrafter
from ddtree_runtime.models.qwen3 import Attention, Qwen3, apply_rope, rope_tables


def _heads(attn: Attention, which: str, x: Tensor, n: int) -> Tensor:
    """x: [N, T, hidden] -> [N, n, T, D] through `which` ("q", "k" or "v") of the projections,
    whether the loader fused them into one QKV weight or not."""
    if attn.qkv_proj is None:
        out = getattr(attn, f"{which}_proj")(x)
    else:
        d, hq, hkv = attn.head_dim, attn.n_heads, attn.n_kv
        start, size = {"q": (0, hq * d), "k": (hq * d, hkv * d), "v": ((hq + hkv) * d, hkv * d)}[which]
        bias = attn.qkv_proj.bias
        out = F.linear(
            x,
            attn.qkv_proj.weight[start : start + size],
            None if bias is None else bias[start : start + size],
        )
    return out.view(x.shape[0], x.shape[1], n, attn.head_dim).transpose(1, 2)


def target_forward(
    model: Qwen3, tokens: Tensor, capture: tuple[int, ...] = (), logits: bool = True
) -> tuple[Tensor | None, Tensor | None]:
    """tokens: [N, T] -> logits [N, T, V] (or None), hidden [N, T, len(capture) * hidden] (or None).

    A plain causal pass with no cache; captured layers follow the runtime's rule (the last layer's
    entry is the normed output)."""
    cfg = model.config
    n, t = tokens.shape
    cos, sin = rope_tables(cfg.head_dim, cfg.rope_theta, t, tokens.device)
    x = model.embed_tokens(tokens)  # [N, T, hidden]
    captured: dict[int, Tensor] = {}
    for i, layer in enumerate(model.layers):
        attn = layer.self_attn
        h = layer.input_layernorm(x)
        q = apply_rope(attn.q_norm(_heads(attn, "q", h, attn.n_heads)), cos, sin)  # [N, Hq, T, D]
        k = apply_rope(attn.k_norm(_heads(attn, "k", h, attn.n_kv)), cos, sin)
        v = _heads(attn, "v", h, attn.n_kv)
        out = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=attn.head_dim**-0.5, enable_gqa=True
        )
        x = x + attn.o_proj(out.transpose(1, 2).reshape(n, t, -1))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
        if i in capture:
            captured[i] = x
    x = model.norm(x)
    if len(model.layers) - 1 in captured:
        captured[len(model.layers) - 1] = x
    hidden = torch.cat([captured[i] for i in capture], dim=-1) if capture else None
    return (model.lm_head(x) if logits else None), hidden


def block_visibility(seq_len: int, anchors: Tensor, block: int, causal: bool, window: int | None) -> Tensor:
    """[K * B, seq_len + K * B] bool: which context rows and block rows each block row sees."""
    k = anchors.shape[0]
    offs = torch.arange(block, device=anchors.device)
    q_pos = (anchors[:, None] + offs[None, :]).reshape(-1, 1)  # [K*B, 1]
    q_blk = torch.arange(k, device=anchors.device).repeat_interleave(block)[:, None]
    ctx_pos = torch.arange(seq_len, device=anchors.device)[None, :]
    ctx = ctx_pos < anchors.repeat_interleave(block)[:, None]  # context strictly before the anchor
    kv_pos = q_pos.reshape(1, -1)
    own = q_blk == q_blk.reshape(1, -1)
    if causal:
        own &= kv_pos <= q_pos
    if window is not None:
        ctx &= q_pos - ctx_pos < window
        own &= (q_pos - kv_pos).abs() < window if not causal else q_pos - kv_pos < window
    return torch.cat([ctx, own], dim=1)


def drafter_blocks(
    drafter: DFlashDrafter, features: Tensor, tokens: Tensor, anchors: Tensor, embed: Tensor
) -> Tensor:
    """features: [T, n_ids * hidden]; tokens: [T]; anchors: [K] (each <= T - B).
    Returns the blocks' final hidden states [K, B, hidden] (row 0 is the anchor's, unused)."""
    cfg, lc = drafter.config, drafter.config.layers
    block, seq_len, k = cfg.block_size, tokens.shape[0], anchors.shape[0]
    cos, sin = rope_tables(lc.head_dim, lc.rope_theta, seq_len + block, tokens.device)
    q_pos = (anchors[:, None] + torch.arange(block, device=tokens.device)).reshape(-1)  # [K*B]
    ids = torch.full((k, block), cfg.mask_token_id, device=tokens.device, dtype=tokens.dtype)
    ids[:, 0] = tokens[anchors]
    x = F.embedding(ids.reshape(-1), embed) * cfg.input_embedding_scale  # [K*B, hidden]
    ctx = drafter.hidden_norm(drafter.fc(features))  # [T, hidden]
    kv_cos = torch.cat([cos[:seq_len], cos[q_pos]])
    kv_sin = torch.cat([sin[:seq_len], sin[q_pos]])
    masks: dict[tuple[bool, int | None], Tensor] = {}
    for i, layer in enumerate(drafter.layers):
        attn = layer.self_attn
        h = layer.input_layernorm(x)
        kv_in = torch.cat([ctx, h])[None]  # [1, T + K*B, hidden]
        kk = apply_rope(attn.k_norm(_heads(attn, "k", kv_in, attn.n_kv)), kv_cos, kv_sin)
        vv = _heads(attn, "v", kv_in, attn.n_kv)
        q = apply_rope(attn.q_norm(_heads(attn, "q", h[None], attn.n_heads)), cos[q_pos], sin[q_pos])
        kind = (cfg.causal[i], cfg.windows[i])
        if kind not in masks:
            masks[kind] = block_visibility(seq_len, anchors, block, *kind)
        out = F.scaled_dot_product_attention(
            q, kk, vv, attn_mask=masks[kind], scale=attn.head_dim**-0.5, enable_gqa=True
        )  # [1, Hq, K*B, D]
        x = x + attn.o_proj(out[0].transpose(0, 1).reshape(k * block, -1))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return drafter.norm(x).view(k, block, -1)


@torch.no_grad()
def greedy_batch(
    model: Qwen3, prompts: list[list[int]], max_new_tokens: int, eos_ids: set[int]
) -> list[list[int]]:
    """Greedy continuations of many prompts at once (self-distillation's regeneration).

    Prompts are left-padded; each row's RoPE positions start at its first real token and padded
    keys are masked out, so a row decodes as it would alone (up to float rounding). A row's output
    ends at its first EOS (kept)."""
    cfg, device = model.config, model.embed_tokens.weight.device
    n, width = len(prompts), max(len(p) for p in prompts)
    total = width + max_new_tokens
    pad = torch.tensor([width - len(p) for p in prompts], device=device)  # [N]
    tokens = torch.zeros(n, width, dtype=torch.int64, device=device)
    for i, p in enumerate(prompts):
        tokens[i, width - len(p) :] = torch.tensor(p, device=device)
    cos, sin = rope_tables(cfg.head_dim, cfg.rope_theta, total, device)
    shape = (len(model.layers), n, cfg.num_key_value_heads, total, cfg.head_dim)
    k_cache = torch.zeros(shape, device=device, dtype=model.embed_tokens.weight.dtype)
    v_cache = torch.zeros_like(k_cache)
    key_ok = torch.arange(total, device=device)[None, :] >= pad[:, None]  # [N, S]: not padding
    out = torch.zeros(n, max_new_tokens, dtype=torch.int64, device=device)
    start, step_tokens = 0, tokens
    for t in range(max_new_tokens + 1):
        q_len = step_tokens.shape[1]
        rows = torch.arange(start, start + q_len, device=device)
        pos = (rows[None, :] - pad[:, None]).clamp(min=0)  # [N, T]
        c, s = cos[pos][:, None], sin[pos][:, None]  # [N, 1, T, D]
        mask = key_ok[:, None, None, : start + q_len] & (
            torch.arange(start + q_len, device=device)[None, :] <= rows[:, None]
        )  # [N, 1, T, S]
        x = model.embed_tokens(step_tokens)
        for i, layer in enumerate(model.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = apply_rope(attn.q_norm(_heads(attn, "q", h, attn.n_heads)), c, s)
            k_cache[i, :, :, start : start + q_len] = apply_rope(
                attn.k_norm(_heads(attn, "k", h, attn.n_kv)), c, s
            )
            v_cache[i, :, :, start : start + q_len] = _heads(attn, "v", h, attn.n_kv)
            o = F.scaled_dot_product_attention(
                q, k_cache[i, :, :, : start + q_len], v_cache[i, :, :, : start + q_len],
                attn_mask=mask, scale=attn.head_dim**-0.5, enable_gqa=True,
            )  # fmt: skip
            x = x + attn.o_proj(o.transpose(1, 2).reshape(n, q_len, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        if t == max_new_tokens:
            break
        nxt = model.lm_head(model.norm(x[:, -1])).argmax(-1)  # [N]
        out[:, t] = nxt
        start, step_tokens = start + q_len, nxt[:, None]
    result = []
    for row in out.tolist():
        cut = next((j + 1 for j, tok in enumerate(row) if tok in eos_ids), len(row))
        result.append(row[:cut])
    return result
