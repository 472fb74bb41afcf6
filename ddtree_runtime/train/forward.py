"""Training-time forwards, run through the models' own `forward` (training has no layer loop of its own).

- `TargetFeatures`: the frozen target's hidden states at the drafter's `target_layer_ids`, from the
  same prefill call the engine makes, so dense and hybrid targets and every layer kind (Gated
  DeltaNet or full attention) give the drafter exactly the features it reads when served.
- `draft_blocks`: many DFlash blocks of one sequence in one `DFlashDrafter.forward`.

DFlash training (the z-lab recipe): pick anchors `a` in the response; block `a` is
`[x_a, MASK x (B - 1)]` at positions `a .. a + B - 1` and predicts `x_{a+1} .. x_{a+B-1}`. Its rows see
the context features of positions `< a` (as at inference, where the drafter has read every committed
row before the root) and the rows of their own block, subject to each layer's causal/sliding rule.
Blocks never see each other, so K blocks cost one pass: the drafter ingests the whole sequence as
context (cache rows `0 .. T-1`) and drafts the K blocks laid side by side after it. `BlockLayout`, the
backend that pass runs on, gives each block row its true RoPE position and each layer that visibility.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ddtree_runtime.backend import Backend, TorchBackend, select_backend
from ddtree_runtime.models.dflash import DFlashDrafter
from ddtree_runtime.models.target import Target


class TargetFeatures:
    """`features(tokens)`: [T] -> [T, len(layer_ids) * hidden] in the target's dtype, no gradient.

    The target's caches are (re)allocated when a sequence outgrows them or another user (the
    engine) set them up for other layers; a power of two of rows, so a dataset's lengths cost a few
    allocations, not one per sample."""

    def __init__(self, target: Target, layer_ids: tuple[int, ...], backend: Backend | None = None) -> None:
        self.target, self.layer_ids = target, tuple(layer_ids)
        self.device = target.embed_tokens.weight.device
        self.backend = backend or select_backend(self.device)

    @torch.no_grad()  # not inference_mode: the features feed the drafter's graph
    def __call__(self, tokens: Tensor) -> Tensor:
        t, target = tokens.shape[0], self.target
        if target.max_context < t or target.capture_layers != self.layer_ids:
            rows = min(1 << max(0, t - 1).bit_length(), target.config.max_position_embeddings)
            target.setup_caches(max(rows, t), self.layer_ids)
        positions = torch.arange(t, device=self.device)
        _, hidden = target(
            tokens.to(self.device), positions, 0, None, self.backend, logits_dtype=None, last_logits_only=True
        )
        assert hidden is not None
        return hidden


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


class BlockLayout(TorchBackend):
    """The backend of a training pass: a T-row context, then K blocks of B rows side by side.

    The drafter asks for RoPE at its cache rows; a block row's true position is its anchor plus
    its offset. Attention masks come from `block_visibility` per layer kind (causal, window). The
    cache rows are written with the reference's in-place copies, which autograd follows; K/V are
    cloned before attention because later layers write the same cache tensor."""

    def __init__(self, seq_len: int, anchors: Tensor, block: int) -> None:
        offs = torch.arange(block, device=anchors.device)
        blocks = (anchors[:, None] + offs[None, :]).reshape(-1)
        self.positions = torch.cat([torch.arange(seq_len, device=anchors.device), blocks])  # by cache row
        self.seq_len, self.anchors, self.block = seq_len, anchors, block
        self.masks: dict[tuple[bool, int | None], Tensor] = {}

    def qk_rope(
        self,
        qkv: Tensor,
        q_weight: Tensor,
        k_weight: Tensor,
        eps: float,
        cos: Tensor,
        sin: Tensor,
        positions: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        context_len: Tensor,
        n_heads: int,
    ) -> Tensor:
        # under autocast the projections come in bf16; the cache keeps the drafter's dtype
        return super().qk_rope(
            qkv.to(k_cache.dtype),
            q_weight,
            k_weight,
            eps,
            cos,
            sin,
            self.positions[positions],
            k_cache,
            v_cache,
            context_len,
            n_heads,
        )

    def attention(
        self,
        q: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        context_len: int | Tensor,
        visibility: object | None,
        scale: float,
        key_bound: int | None = None,
        all_visible: bool = False,
        window: int | None = None,
    ) -> Tensor:
        # q: [Hq, K*B, D]; k_cache, v_cache: [Hkv, S, D] with the context and every block written
        kind = (not all_visible, window)
        if kind not in self.masks:
            self.masks[kind] = block_visibility(self.seq_len, self.anchors, self.block, *kind)
        rows = self.masks[kind].shape[1]
        k, v = k_cache[:, :rows].clone(), v_cache[:, :rows].clone()
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=self.masks[kind], scale=scale, enable_gqa=True
        )  # [Hq, K*B, D]


def draft_blocks(
    drafter: DFlashDrafter, features: Tensor, tokens: Tensor, anchors: Tensor, embed: Tensor
) -> Tensor:
    """features: [T, n_ids * hidden]; tokens: [T]; anchors: [K] (each <= T - 2); embed: the target's
    embedding matrix. Returns the blocks' final hidden states [K, B, hidden] (row 0 is the anchor's)."""
    cfg = drafter.config
    block, seq_len, k = cfg.block_size, tokens.shape[0], anchors.shape[0]
    ids = torch.full((k, block), cfg.mask_token_id, device=tokens.device, dtype=tokens.dtype)
    ids[:, 0] = tokens[anchors]
    noise = F.embedding(ids.reshape(-1), embed) * cfg.input_embedding_scale  # [K*B, hidden]
    drafter.setup_caches(seq_len + k * block)
    hidden = drafter(features, 0, noise, BlockLayout(seq_len, anchors, block))
    return hidden.view(k, block, -1)
