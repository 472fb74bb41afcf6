"""The hot-path seams: the decoder layers' fused steps, tree attention, tree build and walk, KV
compaction, and the Gated DeltaNet mixer of hybrid targets.

Every step of a decoding round that touches the tree goes through one of these methods, and so do
the decoder layers' small fused steps (RMSNorm with the residual add, q/k norm + RoPE + the cache
write, SwiGLU's gate, the projections), so that the Triton kernels (`ddtree_runtime/triton_backend.py`,
`TritonBackend`) can replace them on CUDA. `TorchBackend` is the CPU path and the oracle the kernels
are tested against (each method here is its kernel's PyTorch reference); it needs no Triton and
favours clarity over speed.

Tree conventions (DDTree, Ringel & Romano, arXiv 2604.12989): node 0 is the root (the bonus token of
the last round); for i >= 1 `parents[i] < i`; node i sits at position `start + depth[i]` and its
K/V are written at cache row `context_len + i`.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor

from ddtree_kernels.host import QuantizedRows
from ddtree_runtime import gated_delta
from ddtree_runtime.fp8 import fp8_linear_reference, quantized_reference
from ddtree_runtime.gated_delta import GdnSpec, Staged, TreeAncestry

Vis = TypeVar("Vis")  # a backend's own description of tree visibility, read only by its `attention`
Plan = TypeVar("Plan")  # a backend's own per-round Gated DeltaNet plan of a tree
Staging = TypeVar("Staging")  # a backend's own staging of one verify pass's DeltaNet layers


class Backend(Protocol[Vis, Plan, Staging]):
    """What the engine and the models call; `TorchBackend` and
    `ddtree_runtime.triton_backend.TritonBackend` both satisfy it.

    A backend may also offer `parts_mask` and `attention_parts`, `tree_walk_parts`, `gdn_steps`,
    and `gdn_forest_plan` with `gdn_forest` (both do; `parts_mask` and `gdn_forest_plan` return the
    backend's own descriptions, as `tree_visibility` and `gdn_plan` do): a batched pass then runs
    attention for all its sequences in one padded call per layer instead of one launch per sequence
    (`models.target.SlotRows`), a hybrid's DeltaNet layers step all its `ar` sequences in one call
    and verify all its trees of one size in one call, and the greedy slots of a batched round walk
    their trees in one call; without them, one sequence at a time.

    The producers of an FP8 linear's input take its activation group (`quant.act_group`):
    `attention_gate` (before `o_proj`) and the DeltaNet calls (their gated norm, before `out_proj`)
    may then return their rows quantized as that linear would (`QuantizedRows`): TorchBackend
    always, TritonBackend where whole groups fit its kernels' programs. Without one, the rows."""

    name: str
    capturable: bool  # its seams do no host work, so a round of them can be a CUDA graph

    def linear(self, x: Tensor, weight: Tensor) -> Tensor: ...

    def fp8_linear(
        self, x: Tensor | QuantizedRows, weight: Tensor, scale: Tensor, block: tuple[int, int]
    ) -> Tensor: ...

    def rms_norm(
        self, x: Tensor, weight: Tensor, eps: float, residual: Tensor | None = None
    ) -> tuple[Tensor, Tensor]: ...

    def rms_norm_fp8(
        self, x: Tensor, weight: Tensor, eps: float, residual: Tensor | None, group: int
    ) -> tuple[Tensor, Tensor, QuantizedRows]: ...

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
        gated: bool = False,
    ) -> Tensor: ...

    def attention_gate(
        self, o: Tensor, qkv: Tensor, n_heads: int, group: int | None = None
    ) -> Tensor | QuantizedRows: ...

    def silu_mul(self, gate_up: Tensor) -> Tensor: ...

    def silu_mul_fp8(self, gate_up: Tensor, group: int) -> QuantizedRows: ...

    def tree_visibility(self, parents: Tensor, depth: Tensor) -> Vis: ...

    def attention(
        self,
        q: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        context_len: int | Tensor,
        visibility: Vis | None,
        scale: float,
        key_bound: int | None = None,
        all_visible: bool = False,
        window: int | None = None,
    ) -> Tensor: ...

    def build_tree(
        self, draft_logits: Tensor, budget: int, root_token: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]: ...

    def build_trees(
        self, draft_logits: Tensor, budget: int, roots: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]: ...

    def tree_walk(
        self,
        tokens: Tensor,
        parents: Tensor,
        logits: Tensor,
        temperature: float,
        generator: torch.Generator | None,
    ) -> tuple[Tensor, Tensor, Tensor]: ...

    def compact(
        self, k_cache: Tensor, v_cache: Tensor, context_len: int | Tensor, path: Tensor, path_len: Tensor
    ) -> None: ...

    def compact_forest(
        self,
        k_caches: Tensor,
        v_caches: Tensor,
        slots: Tensor,
        context_lens: Tensor,
        paths: Tensor,
        path_lens: Tensor,
    ) -> None: ...

    def gdn_plan(self, parents: Tensor, depth: Tensor, kernel: int) -> Plan: ...

    def gdn_staging(
        self, layers: int, nodes: int, spec: GdnSpec, dtype: torch.dtype, slots: int = 1
    ) -> Sequence[Staging]: ...

    def gdn_chain(
        self, proj: Tensor, spec: GdnSpec, conv_state: Tensor, state: Tensor, group: int | None = None
    ) -> Tensor | QuantizedRows: ...

    def gdn_tree(
        self,
        proj: Tensor,
        spec: GdnSpec,
        conv_state: Tensor,
        state: Tensor,
        plan: Plan,
        staging: Staging,
        slot: int,
        group: int | None = None,
    ) -> Tensor | QuantizedRows: ...

    def gdn_commit(
        self,
        conv_states: Tensor,
        states: Tensor,
        staging: Staging,
        plan: Plan,
        path: Tensor,
        path_len: Tensor,
    ) -> None: ...

    def gdn_commit_forest(
        self,
        conv_states: Tensor,
        states: Tensor,
        stagings: Sequence[Staging],
        plans: Sequence[Plan],
        slots: Tensor,
        paths: Tensor,
        path_lens: Tensor,
    ) -> None: ...


class TorchBackend:
    """Plain PyTorch implementation of the seams (SDPA with an explicit boolean mask)."""

    name = "torch"
    capturable = False  # the tree build is a heap on the host

    def tree_visibility(self, parents: Tensor, depth: Tensor) -> Tensor:
        """Dense ancestor-or-self matrix `vis[i, j]` (bool [N, N]); `depth` is not needed here."""
        return ancestors(parents)

    @staticmethod
    def linear(x: Tensor, weight: Tensor) -> Tensor:
        """x @ weight.T (the skinny matmul's reference)."""
        return F.linear(x, weight)

    fp8_linear = staticmethod(fp8_linear_reference)  # dequantizes: W8A8 maths in fp32

    @staticmethod
    def rms_norm(
        x: Tensor, weight: Tensor, eps: float, residual: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """(norm(s), s) with s = x + residual (x without one), fp32 inside; the normalised value is
        rounded to the weight's dtype before the scale (Qwen3: bf16 weights, as its RMSNorm does;
        Qwen3.5: the fp32 (1 + w) scales, rounded once at the end, as its RMSNorm does)."""
        s = x if residual is None else x + residual
        sf = s.float()
        normed = (sf * torch.rsqrt(sf.pow(2).mean(-1, keepdim=True) + eps)).to(weight.dtype)
        return (weight * normed).to(s.dtype), s

    def rms_norm_fp8(
        self, x: Tensor, weight: Tensor, eps: float, residual: Tensor | None, group: int
    ) -> tuple[Tensor, Tensor, QuantizedRows]:
        """`rms_norm`, and its output quantized once for the FP8 linears that read it (per row and
        group of `group` columns, as they would quantize it)."""
        out, s = self.rms_norm(x, weight, eps, residual)
        return out, s, quantized_reference(out, group)

    @staticmethod
    def qk_rope(
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
        gated: bool = False,
    ) -> Tensor:
        """qkv [T, (Hq (x2 if gated) + 2 Hkv) D] -> q [T, Hq, D]: q/k RMSNorm (rounded as `rms_norm`),
        RoPE on the first cos.shape[-1] dims of each head (the rest passes through), K/V rows
        `context_len + t` of the layer's caches [Hkv, S_max, D] written. A gated query head is
        followed by its output gate in qkv (Qwen3.5's gated attention)."""
        t = qkv.shape[0]
        hkv, _, d = k_cache.shape
        width = 2 * d if gated else d
        q = qkv[:, : n_heads * width].view(t, n_heads, width)[..., :d]
        k, v = qkv[:, n_heads * width :].view(t, 2 * hkv, d).split([hkv, hkv], dim=1)

        def norm(x: Tensor, w: Tensor) -> Tensor:
            xf = x.float()
            return (w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(w.dtype)).to(x.dtype)

        rot = cos.shape[-1]
        c, s = cos[positions].to(qkv.dtype)[:, None], sin[positions].to(qkv.dtype)[:, None]  # [T, 1, rot]

        def rope(x: Tensor) -> Tensor:
            x1, x2 = x[..., :rot].chunk(2, dim=-1)
            return torch.cat([x[..., :rot] * c + torch.cat([-x2, x1], dim=-1) * s, x[..., rot:]], dim=-1)

        rows = context_len + torch.arange(t, device=qkv.device)
        k_cache.index_copy_(1, rows, rope(norm(k, k_weight)).transpose(0, 1))
        v_cache.index_copy_(1, rows, v.transpose(0, 1))
        return rope(norm(q, q_weight)).contiguous()

    @staticmethod
    def attention_gate(
        o: Tensor, qkv: Tensor, n_heads: int, group: int | None = None
    ) -> Tensor | QuantizedRows:
        """Gated attention's output o [Hq, T, D] times the sigmoid of each query head's gate (the D
        values after its query values in qkv [T, >= 2 Hq D]): [T, Hq D] (quantized by `group`
        columns when it is set)."""
        t, d = qkv.shape[0], o.shape[-1]
        gate = qkv[:, : 2 * n_heads * d].view(t, n_heads, 2 * d)[..., d:]
        return _quantized((o.transpose(0, 1) * torch.sigmoid(gate)).reshape(t, -1), group)

    @staticmethod
    def silu_mul(gate_up: Tensor) -> Tensor:
        """silu(gate) * up from the fused gate/up projection [T, 2I]: what SwiGLU computes."""
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up

    def silu_mul_fp8(self, gate_up: Tensor, group: int) -> QuantizedRows:
        """`silu_mul` quantized for an FP8 down projection (per row and group of `group` columns)."""
        return quantized_reference(self.silu_mul(gate_up), group)

    def attention(
        self,
        q: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        context_len: int | Tensor,
        visibility: Tensor | None,
        scale: float,
        key_bound: int | None = None,
        all_visible: bool = False,
        window: int | None = None,
    ) -> Tensor:
        """Attention of N new rows over `[0, context_len)` plus the visible new rows.

        q: [Hq, N, D]; k_cache, v_cache: [Hkv, S_max, D] with the new rows already written at
        `context_len .. context_len + N - 1` (row = position). `context_len` may be a 0-d device
        tensor; then `key_bound` (static) is the most keys it can reach and rows past the live
        length are masked. New rows see each other through `visibility` (None: causal), or all of
        them with `all_visible`; `window` keeps only keys fewer than `window` positions away.
        Returns [Hq, N, D] in q's dtype (fp32 inside).
        """
        hq, n, _ = q.shape
        hkv = k_cache.shape[0]
        if hq % hkv:
            raise RuntimeError(f"GQA needs Hq % Hkv == 0, got Hq={hq}, Hkv={hkv}")
        if key_bound is None:
            key_bound = int(context_len) + n
        k = k_cache[:, :key_bound].float().repeat_interleave(hq // hkv, dim=0)  # [Hq, K, D]
        v = v_cache[:, :key_bound].float().repeat_interleave(hq // hkv, dim=0)  # [Hq, K, D]
        mask = attention_mask(n, context_len, key_bound, visibility, all_visible, window, q.device)
        out = F.scaled_dot_product_attention(q.float(), k, v, attn_mask=mask, scale=scale)
        return out.to(q.dtype)

    @staticmethod
    def parts_mask(
        rows: list[int],
        context_lens: list[int] | Tensor,
        keys: int,
        visibilities: list[Tensor | None],
        all_visible: bool,
        window: int | None,
        device: torch.device,
    ) -> Tensor:
        """The masks of several sequences' rows (as `attention` builds each), padded to the most rows
        N and to `keys` keys: bool [P, N, keys]. A padding row sees nothing (its output is dropped)."""
        n = max(rows)
        ctx = torch.as_tensor(context_lens, device=device)
        lens = torch.tensor(rows, device=device)
        rel = torch.arange(keys, device=device) - ctx[:, None]  # [P, K] each key's new-row index
        if all_visible:
            tree = torch.ones(len(rows), n, n, dtype=torch.bool, device=device)
        elif all(v is None for v in visibilities):
            tree = torch.ones(n, n, dtype=torch.bool, device=device).tril().expand(len(rows), n, n)
        elif len(set(rows)) == 1 and all(v is not None for v in visibilities):
            tree = torch.stack(visibilities)  # a forest: trees of one size
        else:
            tree = torch.ones(n, n, dtype=torch.bool, device=device).tril().repeat(len(rows), 1, 1)
            for p, (m, vis) in enumerate(zip(rows, visibilities, strict=True)):
                if vis is not None:
                    tree[p, :m, :m] = vis
        seen = tree.gather(2, rel.clamp(0, n - 1)[:, None, :].expand(-1, n, -1))  # [P, N, K]
        mask = (rel < 0)[:, None] | (seen & (rel < lens[:, None])[:, None])
        if window is not None:
            dist = rel[:, None, :] - torch.arange(n, device=device)[None, :, None]  # key pos - query pos
            mask &= dist > -window
            if all_visible:
                mask &= dist < window
        return mask & (torch.arange(n, device=device) < lens[:, None])[:, :, None]  # padding rows: nothing

    @staticmethod
    def attention_parts(
        q: Tensor, k_caches: Tensor, v_caches: Tensor, slots: Tensor | slice, mask: Tensor, scale: float
    ) -> Tensor:
        """`attention` of several sequences in one call (their rows padded to N, keys to K).

        q: [P, Hq, N, D]; k_caches, v_caches: one layer of every slot's cache [S, Hkv, S_max, D],
        the new rows written; slots: [P] (a slice of consecutive slots reads a view, no copy);
        mask: [P, N, K] (`parts_mask`). The query heads of a K/V head fold into the query rows, so
        the cache is read without a copy per query head. A masked key adds 0 * V: any finite cache
        row (stale or zero) past a sequence's keys drops out.
        Returns [P, Hq, N, D] in q's dtype (fp32 inside)."""
        p, hq, n, d = q.shape
        hkv, keys = k_caches.shape[1], mask.shape[-1]
        k = _slot_rows(k_caches, slots, keys).float()  # [P, Hkv, K, D]
        v = _slot_rows(v_caches, slots, keys).float()
        qf = q.float().reshape(p, hkv, (hq // hkv) * n, d)  # head h = kv head h // G, rows (g, n)
        folded = mask[:, None].repeat(1, 1, hq // hkv, 1)  # [P, 1, G * N, K]
        out = F.scaled_dot_product_attention(qf, k, v, attn_mask=folded, scale=scale)
        return out.reshape(p, hq, n, d).to(q.dtype)

    def build_tree(
        self, draft_logits: Tensor, budget: int, root_token: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """The `budget` most probable prefixes under the product of per-position marginals.

        Best-first search over (depth, rank) with a heap: popping a node pushes its first child
        (next depth, best token) and its next sibling (same depth, next-ranked token). Scores only
        fall along both moves, so nodes pop in descending score order, every prefix pops before
        its extensions (prefix-closed) and a parent always gets a smaller index than its children.
        """
        tokens, parents, depth = self.build_trees(draft_logits[None], budget, root_token.reshape(1))
        return tokens[0], parents[0], depth[0]

    @staticmethod
    def build_trees(draft_logits: Tensor, budget: int, roots: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """`build_tree` of P drafts at once (draft_logits [P, D, V], roots [P]) -> [P, budget + 1]
        each: one top-k and one host read for all, then each tree's heap."""
        depth_max, vocab = draft_logits.shape[1:]
        capacity = sum(vocab**d for d in range(1, depth_max + 1))
        if not 1 <= budget <= capacity:
            raise ValueError(
                f"tree budget {budget} is outside 1..{capacity} (the number of distinct prefixes of "
                f"depth <= {depth_max} over a vocabulary of {vocab}); pick a budget in that range"
            )
        k = min(budget, vocab)
        top_scores, top_tokens = torch.log_softmax(draft_logits.float(), dim=-1).topk(k, dim=-1)
        trees = [
            _best_prefixes(scores, ranked, budget, root)
            for scores, ranked, root in zip(
                top_scores.tolist(), top_tokens.tolist(), roots.tolist(), strict=True
            )
        ]
        tokens, parents, depth = torch.tensor(trees, dtype=torch.int64, device=draft_logits.device).unbind(1)
        return tokens, parents, depth

    def tree_walk(
        self,
        tokens: Tensor,
        parents: Tensor,
        logits: Tensor,
        temperature: float,
        generator: torch.Generator | None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Follow the target's own choice from the root while it matches a child.

        Every node gets its choice up front (argmax, or an independent sample of
        softmax(logits / T)); only the choices along the walk matter, so this is the sequential
        walk's distribution exactly. Node j lies on the walk iff every node on its root path was
        chosen by its parent. Siblings carry distinct tokens, so at most one node per depth is on
        it. Returns path [N] (N - 1 is the deepest a tree of N nodes can be; padded with -1),
        path_len (0-d, counts the root) and bonus (0-d: the last path node's choice).
        """
        n = tokens.shape[-1]
        if temperature > 0:
            probs = torch.softmax(logits.float() / temperature, dim=-1)
            choice = torch.multinomial(probs, 1, generator=generator).squeeze(1)  # [N]
        else:
            choice = logits.float().argmax(dim=-1)  # [..., N]; the CPU's bf16 argmax is 3x slower
        chosen = tokens == choice.gather(-1, parents.clamp(min=0))
        chosen[..., 0] = True
        vis = ancestors(parents)  # ancestor-or-self [..., N, N]
        on_path = ~(vis & ~chosen[..., None, :]).any(dim=-1)  # [..., N]
        depth = vis.sum(dim=-1) - 1
        slot = torch.where(on_path, depth, torch.full_like(depth, n))  # off-path nodes go to a spare slot
        path = torch.full((*tokens.shape[:-1], n + 1), -1, dtype=torch.int64, device=tokens.device)
        path.scatter_(-1, slot, torch.arange(n, device=tokens.device).expand_as(slot))
        path = path[..., :n]
        path_len = on_path.sum(dim=-1)
        last = path.gather(-1, (path_len - 1).unsqueeze(-1))
        return path, path_len, choice.gather(-1, last).squeeze(-1)

    def tree_walk_parts(
        self, tokens: Tensor, parents: Tensor, logits: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """The greedy `tree_walk` of P trees at once: tokens, parents [P, N], logits [P, N, V] (a
        smaller tree padded with nodes of token -1 under the root, which no walk takes). Returns
        path [P, N], path_len [P] and bonus [P]."""
        return self.tree_walk(tokens, parents, logits, 0.0, None)

    def compact(
        self, k_cache: Tensor, v_cache: Tensor, context_len: int | Tensor, path: Tensor, path_len: Tensor
    ) -> None:
        """Move accepted rows `context_len + path[a]` to `context_len + a` in every layer, in place.

        k_cache, v_cache: [L, Hkv, S_max, D]. Rows past path_len copy onto themselves, so the
        shapes stay static and nothing syncs with the host.
        """
        a = torch.arange(path.shape[0], device=path.device)
        src = context_len + torch.where(a < path_len, path, a)
        dst = context_len + a
        for cache in (k_cache, v_cache):
            cache[:, :, dst] = cache[:, :, src]

    @staticmethod
    def compact_forest(
        k_caches: Tensor,
        v_caches: Tensor,
        slots: Tensor,
        context_lens: Tensor,
        paths: Tensor,
        path_lens: Tensor,
    ) -> None:
        """`compact` of P sequences at once (a tree round's commit), sequence p in cache slot
        slots[p] of every slot's caches [S, L, Hkv, S_max, D]: context_lens, path_lens [P], paths
        [P, N]. Slots are distinct but for a scratch slot that padding sequences may repeat (its rows
        come out undefined)."""
        a = torch.arange(paths.shape[1], device=paths.device)
        src = context_lens[:, None] + torch.where(a < path_lens[:, None], paths, a)  # [P, N]
        dst = context_lens[:, None] + a
        rows = slots[:, None].expand_as(dst)
        for cache in (k_caches, v_caches):
            cache[rows, :, :, dst] = cache[rows, :, :, src]  # [P, N, L, Hkv, D] gathered, then scattered

    def gdn_plan(self, parents: Tensor, depth: Tensor, kernel: int) -> TreeAncestry:
        """The tree's ancestor-or-self matrix and conv windows, once per verify pass."""
        return TreeAncestry(ancestors(parents), gated_delta.conv_windows(parents, kernel))

    def gdn_staging(
        self, layers: int, nodes: int, spec: GdnSpec, dtype: torch.dtype, slots: int = 1
    ) -> list[list[Staged | None]]:
        """Per cache slot, an entry per DeltaNet layer, filled by `gdn_tree`."""
        return [[None] * layers for _ in range(slots)]

    def gdn_chain(
        self, proj: Tensor, spec: GdnSpec, conv_state: Tensor, state: Tensor, group: int | None = None
    ) -> Tensor | QuantizedRows:
        """A committed chain (prefill, `ar`) through a DeltaNet layer from its fused projection
        [T, ...]: both states advance in place; returns the normed output [T, Hv Dv] (quantized by
        `group` columns when it is set)."""
        t = proj.shape[0]
        windows = gated_delta.conv_windows(gated_delta.chain_parents(t, proj.device), spec.kernel)
        q, k, v, g, beta = gated_delta.inputs(proj, conv_state, spec, windows)
        o, new_state = gated_delta.chain(q, k, v, g, beta, state)
        gated_delta.advance_conv(conv_state, proj, spec)
        state.copy_(new_state)
        return _quantized(gated_delta.gated_norm(o, proj, spec), group)

    def gdn_steps(
        self,
        proj: Tensor,
        spec: GdnSpec,
        conv_states: Tensor,
        states: Tensor,
        slots: Tensor,
        group: int | None = None,
    ) -> Tensor | QuantizedRows:
        """One token of each of P sequences (a batched pass's `ar` rows), each a `gdn_chain` of one
        in its own cache slot: proj [P, ...], conv_states [S, K-1, C] and states [S, Hv, Dk, Dv]
        (one layer's, every slot), slots [P] (distinct but for a repeated scratch slot, whose rows
        come out undefined). Returns [P, Hv Dv] (quantized by `group` columns when it is set)."""
        steps = [
            self.gdn_chain(proj[p : p + 1], spec, conv_states[slot], states[slot])
            for p, slot in enumerate(slots.tolist())
        ]
        return _quantized(torch.cat(steps), group)

    def gdn_tree(
        self,
        proj: Tensor,
        spec: GdnSpec,
        conv_state: Tensor,
        state: Tensor,
        plan: TreeAncestry,
        staging: list[Staged | None],
        slot: int,
        group: int | None = None,
    ) -> Tensor | QuantizedRows:
        """A tree through a DeltaNet layer, every node along its own root path; nothing advances,
        the layer's staging slot keeps what `gdn_commit` needs. Returns [N, Hv Dv] (quantized by
        `group` columns when it is set)."""
        q, k, v, g, beta = gated_delta.inputs(proj, conv_state, spec, plan.windows)
        o, d, big_g = gated_delta.tree_form(q, k, v, g, beta, plan.anc, state)
        staging[slot] = Staged(proj[:, : spec.conv_dim], k, d, big_g)
        return _quantized(gated_delta.gated_norm(o, proj, spec), group)

    @staticmethod
    def gdn_forest_plan(plans: Sequence[TreeAncestry]) -> list[TreeAncestry]:
        """A pass's verify trees of one size, for `gdn_forest`: each its own plan."""
        return list(plans)

    def gdn_forest(
        self,
        proj: Tensor,
        spec: GdnSpec,
        conv_states: Tensor,
        states: Tensor,
        slots: Tensor,
        plan: list[TreeAncestry],
        stagings: list[list[Staged | None]],
        layer: int,
        group: int | None = None,
    ) -> Tensor | QuantizedRows:
        """P trees of N nodes (proj [P N, ...]), tree p a `gdn_tree` in cache slot slots[p]: over
        conv_states [S, K-1, C] and states [S, Hv, Dk, Dv] (one layer's, every slot), staged in
        stagings[slots[p]] at `layer`. Returns [P N, Hv Dv] (quantized by `group` columns when it
        is set)."""
        n = proj.shape[0] // len(plan)
        trees = [
            self.gdn_tree(
                proj[p * n : (p + 1) * n], spec, conv_states[s], states[s], plan[p], stagings[s], layer
            )
            for p, s in enumerate(slots.tolist())
        ]
        return _quantized(torch.cat(trees), group)

    def gdn_commit(
        self,
        conv_states: Tensor,
        states: Tensor,
        staging: list[Staged | None],
        plan: TreeAncestry,
        path: Tensor,
        path_len: Tensor,
    ) -> None:
        """Every DeltaNet layer's states along the accepted path (padded with -1; path_len 0-d)."""
        last = path.gather(0, (path_len - 1).reshape(1))
        rows = plan.windows[last, 1:].reshape(-1)
        for slot, staged in enumerate(staging):
            assert staged is not None, "gdn_commit before a verify pass"
            conv, state = conv_states[slot], states[slot]
            hist = torch.cat([conv, staged.x.to(conv.dtype)])
            state.copy_(gated_delta.advance_state(state, staged.k, staged.d, staged.big_g, path, path_len))
            conv.copy_(hist[rows])

    def gdn_commit_forest(
        self,
        conv_states: Tensor,
        states: Tensor,
        stagings: list[list[Staged | None]],
        plans: Sequence[TreeAncestry],
        slots: Tensor,
        paths: Tensor,
        path_lens: Tensor,
    ) -> None:
        """P sequences' `gdn_commit`s (a tree round's), sequence p in cache slot slots[p] of every
        slot's conv_states [S, L, K-1, C] and states [S, L, Hv, Dk, Dv], along paths[p] [P, N] of
        length path_lens[p], from its verify pass's staging stagings[slots[p]] and its tree's plan
        plans[p]: one after the other (the reference)."""
        for p, slot in enumerate(slots.tolist()):
            self.gdn_commit(conv_states[slot], states[slot], stagings[slot], plans[p], paths[p], path_lens[p])


def _best_prefixes(
    scores: list[list[float]], ranked: list[list[int]], budget: int, root: int
) -> tuple[list[int], list[int], list[int]]:
    """`build_tree`'s heap over one draft's top-k log-probabilities and tokens [D][k]: the tree's
    tokens, parents and depths, root first."""
    depth_max, k = len(scores), len(scores[0])
    tokens, parents, depths = [root], [-1], [0]
    heap = [(-scores[0][0], 0, 0, 0, 0.0)]  # (-score, depth index, rank, parent node, parent score)
    while len(tokens) <= budget:
        neg, d, r, parent, parent_score = heapq.heappop(heap)
        node = len(tokens)
        tokens.append(ranked[d][r])
        parents.append(parent)
        depths.append(d + 1)
        if d + 1 < depth_max:
            heapq.heappush(heap, (neg - scores[d + 1][0], d + 1, 0, node, -neg))
        if r + 1 < k:
            heapq.heappush(heap, (-(parent_score + scores[d][r + 1]), d, r + 1, parent, parent_score))
    return tokens, parents, depths


def _slot_rows(caches: Tensor, slots: Tensor | slice, keys: int) -> Tensor:
    """The first `keys` rows of each of `slots`' caches [S, H, S_max, D]: a view for a slice, or
    for consecutive slots in host memory (a CPU round's forest: reading them costs nothing there);
    else `index_select` of the narrowed caches (on the CPU 7x faster than advanced indexing, which
    gathers the strided rows element by element)."""
    if isinstance(slots, Tensor) and slots.device.type == "cpu":
        first = int(slots[0])
        if slots.tolist() == list(range(first, first + slots.shape[0])):
            slots = slice(first, first + slots.shape[0])
    if isinstance(slots, slice):
        return caches[slots, :, :keys]
    return caches[:, :, :keys].index_select(0, slots)


def _quantized(rows: Tensor, group: int | None) -> Tensor | QuantizedRows:
    """A producer's rows as it hands them to the linear that reads them: quantized by `group`
    columns for an FP8 one (`act_quant`'s reference), else as they are."""
    return rows if group is None else quantized_reference(rows, group)


def attention_mask(
    n: int,
    context_len: int | Tensor,
    keys: int,
    visibility: Tensor | None,
    all_visible: bool,
    window: int | None,
    device: torch.device,
) -> Tensor:
    """Which of `keys` cache rows each of N new rows at `context_len ..` sees (bool [N, keys]):
    the context, and the new rows that `visibility` allows (None: causal; all with `all_visible`),
    within `window` positions when set."""
    if all_visible:
        tree = torch.ones(n, n, dtype=torch.bool, device=device)
    elif visibility is None:
        tree = torch.ones(n, n, dtype=torch.bool, device=device).tril()
    else:
        tree = visibility
    rel = torch.arange(keys, device=device) - context_len  # key's new-row index (< 0: context)
    mask = (rel < 0)[None, :] | (tree[:, rel.clamp(0, n - 1)] & (rel < n)[None, :])  # [N, K]
    if window is not None:
        dist = rel[None, :] - torch.arange(n, device=device)[:, None]  # key pos - query pos
        mask &= dist > -window
        if all_visible:
            mask &= dist < window
    return mask


def ancestors(parents: Tensor) -> Tensor:
    """Ancestor-or-self matrix (bool [..., N, N] of parents [..., N]) by boolean closure, without a
    host sync.

    Repeated squaring of `I | parent-edge`: after t squarings it holds every ancestor up to 2**t
    steps away, and a tree of N nodes is at most N - 1 deep.
    """
    n = parents.shape[-1]
    reach = torch.eye(n, device=parents.device, dtype=torch.float32).expand(*parents.shape, n).clone()
    # parents[0] == -1: clamped, the root points at itself, which the identity already holds.
    reach.scatter_(-1, parents.clamp(min=0).unsqueeze(-1), 1.0)
    for _ in range(max(1, (max(n, 2) - 1).bit_length())):  # ceil(log2(n)) squarings
        reach = (reach @ reach).clamp(max=1.0)
    return reach > 0


def select_backend(device: torch.device) -> Backend[Any, Any, Any]:
    """The Triton backend on CUDA, else the PyTorch one. On CUDA the Triton backend must load: a
    broken install fails here, with the cause, instead of serving at a fraction of the speed."""
    if torch.device(device).type != "cuda":
        return TorchBackend()
    try:
        from ddtree_runtime.triton_backend import TritonBackend
    except ImportError as exc:
        raise RuntimeError(
            f"the Triton backend does not load on {device} ({exc}); fix: install the runtime extra "
            "(pip install 'specops[runtime]': triton, flash-linear-attention) or run on the CPU"
        ) from exc
    return TritonBackend()
