"""DFlash drafter (z-lab format): Qwen3-shaped draft layers conditioned on target hidden states.

One pass drafts a whole block. The context features (target hidden states after the layers in
`target_layer_ids`, concatenated) go through `fc` and `hidden_norm` and become keys and values in
every draft layer, with RoPE at their absolute positions. The block `[bonus, MASK x (B - 1)]`,
embedded with the target's embeddings, supplies the queries (and keys/values of its own). Sliding
layers are causal within a window; full layers see the whole block unless `is_causal` is set. The
drafter owns no embedding or LM head; the caller passes the target's.

The context K/V stay in a static cache written by position; the block's rows after the context are
scratch that the next round's context overwrites ("cropping" is just the caller's position counter).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ddtree_runtime.config import DFlashConfig
from ddtree_runtime.models.qwen3 import DecoderLayer, RMSNorm, apply_rope, rope_tables


def block_mask(
    start: int, total: int, causal: bool, window: int | None, device: torch.device
) -> Tensor | None:
    """Visibility [Bk, total] of block rows `start..total-1` over rows `0..total-1` (row = position)."""
    if not causal and window is None:
        return None
    q_pos = torch.arange(start, total, device=device)[:, None]
    k_pos = torch.arange(total, device=device)[None, :]
    mask = torch.ones(total - start, total, dtype=torch.bool, device=device)
    if causal:
        mask &= k_pos <= q_pos
    if window is not None:
        mask &= q_pos - k_pos < window
        if not causal:
            mask &= k_pos - q_pos < window
    return mask


class DFlashDrafter(nn.Module):
    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__()
        self.config = cfg
        lc = cfg.layers
        self.layers = nn.ModuleList(DecoderLayer(lc) for _ in range(lc.num_hidden_layers))
        self.norm = RMSNorm(lc.hidden_size, lc.rms_norm_eps)
        self.fc = nn.Linear(len(cfg.target_layer_ids) * lc.hidden_size, lc.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(lc.hidden_size, lc.rms_norm_eps)
        self.k_cache: Tensor | None = None
        self.v_cache: Tensor | None = None

    def setup_caches(self, max_context: int) -> None:
        """Context K/V cache [L, Hkv, S_max, D] and RoPE tables, allocated once."""
        lc, w = self.config.layers, self.fc.weight
        shape = (lc.num_hidden_layers, lc.num_key_value_heads, max_context, lc.head_dim)
        self.k_cache = torch.zeros(shape, device=w.device, dtype=w.dtype)
        self.v_cache = torch.zeros(shape, device=w.device, dtype=w.dtype)
        self.cos, self.sin = rope_tables(lc.head_dim, lc.rope_theta, max_context, w.device)

    def forward(self, features: Tensor, ctx_start: int, noise: Tensor) -> Tensor:
        """features: [C, n_ids * hidden] at positions `ctx_start ..`; noise: [Bk, hidden], the
        embedded block right after them. Returns the block's final hidden states [Bk, hidden]."""
        if self.k_cache is None or self.v_cache is None:
            raise RuntimeError("call setup_caches(max_context) before forward")
        cfg = self.config
        start = ctx_start + features.shape[0]
        total, bk = start + noise.shape[0], noise.shape[0]
        ctx = self.hidden_norm(self.fc(features))  # [C, hidden]
        cos_kv, sin_kv = self.cos[ctx_start:total], self.sin[ctx_start:total]  # [C + Bk, D]
        x = noise
        masks: dict[tuple[bool, int | None], Tensor | None] = {}
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)  # [Bk, hidden]
            kv_in = torch.cat([ctx, h])  # [C + Bk, hidden]
            self.k_cache[i, :, ctx_start:total] = apply_rope(
                attn.k_norm(attn.heads(attn.k_proj, kv_in, attn.n_kv)), cos_kv, sin_kv
            )
            self.v_cache[i, :, ctx_start:total] = attn.heads(attn.v_proj, kv_in, attn.n_kv)
            q = apply_rope(attn.q_norm(attn.heads(attn.q_proj, h, attn.n_heads)), cos_kv[-bk:], sin_kv[-bk:])
            rep = attn.n_heads // attn.n_kv
            k = self.k_cache[i, :, :total].repeat_interleave(rep, dim=0)  # [Hq, total, D]
            v = self.v_cache[i, :, :total].repeat_interleave(rep, dim=0)
            kind = (cfg.causal[i], cfg.windows[i])
            if kind not in masks:
                masks[kind] = block_mask(start, total, *kind, x.device)
            mask = masks[kind]
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, scale=attn.head_dim**-0.5
            )  # [Hq, Bk, D]
            x = x + attn.o_proj(out.transpose(0, 1).reshape(bk, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.norm(x)

    def logits(self, hidden: Tensor, lm_head: nn.Module) -> Tensor:
        """Draft logits [Bk, V] (fp32) through the target's head, with the config's output scaling."""
        cfg = self.config
        logits = lm_head(hidden).float() * cfg.output_multiplier
        if cfg.final_logit_softcapping:
            logits = torch.tanh(logits / cfg.final_logit_softcapping) * cfg.final_logit_softcapping
        return logits
