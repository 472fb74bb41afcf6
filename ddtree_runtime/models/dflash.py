"""DFlash drafter (z-lab format): Qwen3-shaped draft layers conditioned on target hidden states.

One pass drafts a whole block. The context features (target hidden states after the layers in
`target_layer_ids`, concatenated) go through `fc` and `hidden_norm` and become keys and values in
every draft layer, with RoPE at their absolute positions. The block `[bonus, MASK x (B - 1)]`,
embedded with the target's embeddings, supplies the queries (and keys/values of its own). Sliding
layers are causal within a window; full layers see the whole block unless `is_causal` is set. The
drafter owns no embedding or LM head; the caller passes the target's.

The context K/V stay in a static cache written by position; the block's rows after the context are
scratch that the next round's context overwrites ("cropping" is just the caller's position counter).
Attention goes through the backend: on CUDA the block's queries read the context and the block
through the tree-attention kernel (GQA in the kernel, no copy of the cache per round).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from ddtree_runtime.backend import Backend, TorchBackend
from ddtree_runtime.config import DFlashConfig
from ddtree_runtime.models.qwen3 import DecoderLayer, RMSNorm, linear, rope_tables
from ddtree_runtime.models.target import (
    Forest,
    Part,
    SlotRows,
    as_device_length,
    attend_slots,
    per_part,
    slot_rows,
)


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

    def fuse(self) -> None:
        """Fused QKV and gate/up projections for inference (done by the loader)."""
        for layer in self.layers:
            layer.fuse()

    def setup_caches(self, max_context: int, slots: int = 1) -> None:
        """Context K/V caches [L, Hkv, S_max, D], one per slot (`k_cache` is slot 0's), and RoPE
        tables, allocated once."""
        lc, w = self.config.layers, self.fc.weight
        shape = (slots, lc.num_hidden_layers, lc.num_key_value_heads, max_context, lc.head_dim)
        self.k_caches = torch.zeros(shape, device=w.device, dtype=w.dtype)
        self.v_caches = torch.zeros(shape, device=w.device, dtype=w.dtype)
        self.k_cache, self.v_cache = self.k_caches[0], self.v_caches[0]
        self.cos, self.sin = rope_tables(lc.head_dim, lc.rope_theta, max_context, w.device)

    def ingest(
        self, features: Tensor, ctx_start: int | Tensor, backend: Backend[Any, Any, Any], slot: int = 0
    ) -> None:
        """Write the context K/V of `features` ([C, n_ids * hidden], positions `ctx_start ..`) in every
        layer of `slot`'s cache. A context row's K/V depend on the features alone (the same `fc`
        output feeds every layer), so the prompt is read once at prefill and each round adds its
        accepted rows.

        For a captured graph `features` is padded to a fixed C rows, of which the first few are real;
        the padding lands on the rows the block takes next, and the block overwrites it.
        """
        start = as_device_length(ctx_start, features.device)
        positions = start + torch.arange(features.shape[0], device=features.device)
        self.ingest_parts(features, [Part(slot, positions, positions, start)], backend)

    def ingest_parts(
        self, features: Tensor, parts: Sequence[Part] | Forest, backend: Backend[Any, Any, Any]
    ) -> None:
        """`ingest` for several slots at once: features [sum of the parts' rows, n_ids * hidden], each
        part's rows at `input_pos` from `context_len` in its slot (its `tokens` only count its rows).
        `fc` and the projections run over every part's rows at once, and so do q/k norm + RoPE and
        the cache write on a backend with `attention_parts` (the CPU's batched path). A `Forest`
        (without trees) in place of the parts: N rows of each of P slots from device tensors
        alone, which a graph can capture (a tree round's accepted rows)."""
        assert self.k_cache is not None and self.v_cache is not None
        lc = self.config.layers
        ctx, _ = backend.rms_norm(
            linear(self.fc, features, backend), self.hidden_norm.weight, lc.rms_norm_eps
        )  # [C, hidden]
        if isinstance(parts, Forest):
            batch, parts = SlotRows.of_forest(parts), []
        else:
            batch = slot_rows(parts, backend)
        sizes = [p.rows for p in parts]
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            if batch is not None:  # every part's K/V in one step and one scatter
                kc, vc = self.k_caches[:, i], self.v_caches[:, i]
                attn.rope_slots(
                    attn.kv(ctx, backend), self.cos, self.sin, batch, kc, vc, backend, queries=False
                )
                continue
            for part, kv in zip(parts, attn.kv(ctx, backend).split(sizes), strict=True):
                kc, vc = self.k_caches[part.slot, i], self.v_caches[part.slot, i]
                start = as_device_length(part.context_len, kv.device)
                attn.rope(kv, self.cos, self.sin, part.input_pos, kc, vc, start, backend, queries=False)

    def draft(
        self,
        noise: Tensor,
        start: int | Tensor,
        backend: Backend[Any, Any, Any],
        key_bound: int | None = None,
    ) -> Tensor:
        """noise: [Bk, hidden], the embedded block at positions `start ..` right after the ingested
        context. Returns the block's final hidden states [Bk, hidden]. `start` may be a device
        scalar, with `key_bound` the most keys the block can reach."""
        positions = as_device_length(start, noise.device) + torch.arange(noise.shape[0], device=noise.device)
        part = Part(0, positions, positions, start, None, key_bound)
        return self.draft_parts(noise, [part], backend)

    def draft_parts(
        self, noise: Tensor, parts: Sequence[Part] | Forest, backend: Backend[Any, Any, Any]
    ) -> Tensor:
        """Several slots' blocks in one pass: noise [sum of the parts' rows, hidden], each part a
        block at `input_pos` right after its slot's ingested context (`context_len`; its `tokens`
        only count its rows). The projections and MLPs run over every block's rows at once,
        attention per part over its own cache (one padded call for all, on a backend with
        `attention_parts`). A `Forest` (without trees) in place of the parts: the blocks from
        device tensors alone, which a graph can capture."""
        assert self.k_cache is not None and self.v_cache is not None
        eps = self.config.layers.rms_norm_eps
        if isinstance(parts, Forest):
            batch, parts = SlotRows.of_forest(parts), []
        else:
            parts = [p.resolved() for p in parts]
            batch = slot_rows(parts, backend)
        masks: dict[tuple[bool, int | None], Any] = {}  # one per kind of layer (causal?, window)
        h, x = backend.rms_norm(noise, self.layers[0].input_layernorm.weight, eps)
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            qkv = attn.qkv(h, backend)
            if batch is not None:  # every block's attention in one call
                kc, vc = self.k_caches[:, i], self.v_caches[:, i]
                kind = (self.config.causal[i], self.config.windows[i])
                if kind not in masks:
                    masks[kind] = batch.mask(backend, all_visible=not kind[0], window=kind[1])
                mask = masks[kind]
                q = attn.rope_slots(qkv, self.cos, self.sin, batch, kc, vc, backend)
                out = attend_slots(q, batch, mask, kc, vc, backend)
            else:
                out = per_part(qkv, parts, partial(self._attend, i, backend), dim=1)
            h, x = backend.rms_norm(
                attn.output(out, backend), layer.post_attention_layernorm.weight, eps, residual=x
            )
            nxt = self.layers[i + 1].input_layernorm if i + 1 < len(self.layers) else self.norm
            h, x = backend.rms_norm(layer.mlp(h, backend), nxt.weight, eps, residual=x)
        return h

    def _attend(self, layer: int, backend: Backend[Any, Any, Any], part: Part, qkv: Tensor) -> Tensor:
        """One block's attention in `layer` from its projection rows: [Hq, Bk, D]."""
        cfg, attn = self.config, self.layers[layer].self_attn
        kc, vc = self.k_caches[part.slot, layer], self.v_caches[part.slot, layer]
        q = attn.rope(qkv, self.cos, self.sin, part.input_pos, kc, vc, part.context_len, backend)
        return backend.attention(
            q,
            kc,
            vc,
            part.context_len,
            None,
            attn.head_dim**-0.5,
            key_bound=part.key_bound,
            all_visible=not cfg.causal[layer],
            window=cfg.windows[layer],
        )

    def forward(
        self, features: Tensor, ctx_start: int, noise: Tensor, backend: Backend[Any, Any, Any] | None = None
    ) -> Tensor:
        """features: [C, n_ids * hidden] at positions `ctx_start ..`; noise: [Bk, hidden], the
        embedded block right after them. Returns the block's final hidden states [Bk, hidden]."""
        if self.k_cache is None or self.v_cache is None:
            raise RuntimeError("call setup_caches(max_context) before forward")
        backend = backend or TorchBackend()
        self.ingest(features, ctx_start, backend)
        return self.draft(noise, ctx_start + features.shape[0], backend)

    def logits(self, hidden: Tensor, lm_head: nn.Module) -> Tensor:
        """Draft logits [Bk, V] (fp32) through the target's head (or its FP8 copy, `engine.draft_head`),
        with the config's output scaling."""
        cfg = self.config
        logits = lm_head(hidden).float() * cfg.output_multiplier
        if cfg.final_logit_softcapping:
            logits = torch.tanh(logits / cfg.final_logit_softcapping) * cfg.final_logit_softcapping
        return logits
