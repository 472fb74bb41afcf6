"""Qwen3 dense decoder with a static KV cache and hidden-state capture for the drafter.

Shaped after gpt-fast: the cache `[L, Hkv, S_max, D]` is allocated once (tree slots included) and
written by row; `input_pos` (RoPE positions) and the cache row `context_len` are passed explicitly,
because tree nodes sit at `start + depth` while their rows are `start + node index`. Parameter names
follow Hugging Face's minus the `model.` prefix, so checkpoints load without a mapping table.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from ddtree_runtime.backend import Backend, TorchBackend
from ddtree_runtime.config import Qwen3Config
from ddtree_runtime.models.target import (
    Forest,
    Part,
    SlotRows,
    TreeInputs,
    as_device_length,
    attend_slots,
    per_part,
    slot_rows,
    write_slots,
)
from ddtree_runtime.quant import Fp8Input, Fp8Linear, act_group, norm_rows, swiglu_rows


class RMSNorm(nn.Module):
    """RMSNorm computed in fp32 and scaled in the input dtype (as Qwen3 does)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rope_tables(
    head_dim: int, theta: float, max_positions: int, device: torch.device
) -> tuple[Tensor, Tensor]:
    """cos, sin: [max_positions, head_dim] in fp32 (the half-split layout of `rotate_half`)."""
    inv_freq = 1.0 / theta ** (
        torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim
    )
    freqs = torch.arange(max_positions, device=device).float()[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x: [..., T, D]; cos, sin: [T, D] (fp32, cast to x's dtype as HF does), the half-split layout.
    The runtime's hot path fuses this into `backend.qk_rope`; training and the hybrid use it as is."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class MLP(nn.Module):
    """SwiGLU. `fuse()` (at load) merges gate and up into one projection: one GEMM, one read of x."""

    def __init__(self, hidden: int, inner: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inner, bias=False)
        self.up_proj = nn.Linear(hidden, inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)
        self.gate_up_proj: nn.Linear | Fp8Linear | None = None

    def fuse(self) -> None:
        self.gate_up_proj = _fused(self.gate_proj, self.up_proj)
        del self.gate_proj, self.up_proj

    def forward(self, x: Tensor | Fp8Input, backend: Backend | None = None) -> Tensor:
        backend = backend or TorchBackend()
        if self.gate_up_proj is not None:
            gate_up = linear(self.gate_up_proj, x, backend)  # [T, 2I]
        else:
            assert isinstance(x, Tensor), "unfused projections read unquantized rows"
            gate_up = torch.cat([self.gate_proj(x), self.up_proj(x)], dim=-1)
        return linear(self.down_proj, swiglu_rows(backend, gate_up, act_group(self.down_proj)), backend)


def linear(layer: nn.Linear | Fp8Linear, x: Tensor | Fp8Input, backend: Backend) -> Tensor:
    """`layer(x)` through the backend's matmul (a bandwidth-bound kernel for a few rows on CUDA);
    an FP8 target's quantized layers through its FP8 matmul, from the rows' producer's quantization
    when it made one."""
    if isinstance(layer, Fp8Linear):
        rows = x.q if isinstance(x, Fp8Input) else x
        out = backend.fp8_linear(rows, layer.weight, layer.scale, layer.block)
    else:
        rows = x.x if isinstance(x, Fp8Input) else x
        assert rows is not None, "a bf16 linear reads rows written only quantized"
        out = backend.linear(rows, layer.weight)
    return out if layer.bias is None else out + layer.bias


def _fused(*parts: nn.Linear | Fp8Linear) -> nn.Linear | Fp8Linear:
    """One Linear whose output is the parts' outputs side by side (weights concatenated once)."""
    if isinstance(parts[0], Fp8Linear):
        return Fp8Linear.fused(parts)
    w = torch.cat([p.weight.detach() for p in parts])
    bias = parts[0].bias is not None
    with torch.device("meta"):  # no throwaway initialisation of a full-size weight
        fused = nn.Linear(w.shape[1], w.shape[0], bias=bias, dtype=w.dtype)
    fused.weight = nn.Parameter(w, requires_grad=False)
    if bias:
        fused.bias = nn.Parameter(torch.cat([p.bias.detach() for p in parts]), requires_grad=False)
    return fused


class Attention(nn.Module):
    """Grouped-query attention with q/k RMSNorm over the head dimension.

    `fuse()` (at load) merges q, k and v into one projection. q/k norm, RoPE and the K/V cache
    write are one backend step (`qk_rope`), and the context length may be a device tensor.
    """

    def __init__(self, cfg: Qwen3Config) -> None:
        super().__init__()
        d, bias = cfg.head_dim, cfg.attention_bias
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, d
        self.q_proj = nn.Linear(cfg.hidden_size, self.n_heads * d, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.n_kv * d, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.n_kv * d, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * d, cfg.hidden_size, bias=bias)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.qkv_proj: nn.Linear | Fp8Linear | None = None

    def fuse(self) -> None:
        self.qkv_proj = _fused(self.q_proj, self.k_proj, self.v_proj)
        del self.q_proj, self.k_proj, self.v_proj

    def qkv(self, x: Tensor | Fp8Input, backend: Backend) -> Tensor:
        """x: [T, hidden] -> [T, (Hq + 2 Hkv) D]."""
        if self.qkv_proj is not None:
            return linear(self.qkv_proj, x, backend)
        assert isinstance(x, Tensor), "unfused projections read unquantized rows"
        return torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)

    def kv(self, x: Tensor, backend: Backend) -> Tensor:
        """x: [T, hidden] -> [T, 2 Hkv D], the keys and values alone: a DFlash drafter's context rows
        need no queries, and the q rows are 2/3 of a 27B drafter's projection (a bandwidth-bound
        read of 42 MB a layer at a round's few rows)."""
        fused = self.qkv_proj
        if fused is None:
            return torch.cat([self.k_proj(x), self.v_proj(x)], dim=-1)
        assert isinstance(fused, nn.Linear), "a drafter's projections stay in its own dtype"
        q_rows = self.n_heads * self.head_dim
        out = backend.linear(x, fused.weight[q_rows:])
        return out if fused.bias is None else out + fused.bias[q_rows:]

    def rope(
        self,
        qkv: Tensor,
        cos: Tensor,
        sin: Tensor,
        positions: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        context_len: Tensor,
        backend: Backend,
        queries: bool = True,
    ) -> Tensor:
        """Queries [Hq, T, D] of a projection `qkv` [T, ...] (q/k norm and RoPE); its keys and
        values go to cache rows `context_len ..`. With `queries=False` qkv holds the keys and
        values alone (`kv`) and no queries come back ([0, T, D])."""
        q = backend.qk_rope(
            qkv,
            self.q_norm.weight,
            self.k_norm.weight,
            self.q_norm.eps,
            cos,
            sin,
            positions,
            k_cache,
            v_cache,
            context_len,
            self.n_heads if queries else 0,
        )  # [T, Hq, D]
        return q.transpose(0, 1)

    def rope_slots(
        self,
        qkv: Tensor,
        cos: Tensor,
        sin: Tensor,
        batch: SlotRows,
        k_caches: Tensor,
        v_caches: Tensor,
        backend: Backend,
        queries: bool = True,
    ) -> Tensor:
        """`rope` of several parts' projection rows `qkv` [T, ...] in one step (into scratch K/V),
        then one scatter of their K/V rows into each part's slot of this layer's caches
        [S, Hkv, S_max, D]. Returns the queries [Hq, T, D] (none with `queries=False`, as `rope`)."""
        t, d = qkv.shape[0], self.head_dim
        k_new, v_new = qkv.new_empty(self.n_kv, t, d), qkv.new_empty(self.n_kv, t, d)
        start = as_device_length(0, qkv.device)
        q = self.rope(qkv, cos, sin, batch.positions, k_new, v_new, start, backend, queries)
        write_slots(batch, k_new, v_new, k_caches, v_caches)
        return q

    def output(self, attn: Tensor, backend: Backend) -> Tensor:
        """attn [Hq, T, D] -> [T, hidden]."""
        return linear(self.o_proj, attn.transpose(0, 1).reshape(attn.shape[1], -1), backend)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: Qwen3Config) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def fuse(self) -> None:
        self.self_attn.fuse()
        self.mlp.fuse()

    def hf_state_dict(self) -> dict[str, Tensor]:
        """The layer's weights under Hugging Face's names, whatever the layout (fused or not)."""
        state = dict(self.state_dict())
        attn, mlp = self.self_attn, self.mlp
        if attn.qkv_proj is not None:
            d = attn.head_dim
            sizes = [attn.n_heads * d, attn.n_kv * d, attn.n_kv * d]
            for kind in ("weight", "bias"):
                fused = state.pop(f"self_attn.qkv_proj.{kind}", None)
                if fused is not None:
                    for name, part in zip("qkv", fused.split(sizes), strict=True):
                        state[f"self_attn.{name}_proj.{kind}"] = part
        if mlp.gate_up_proj is not None:
            gate, up = state.pop("mlp.gate_up_proj.weight").chunk(2)
            state["mlp.gate_proj.weight"], state["mlp.up_proj.weight"] = gate, up
        return state


def outputs(
    model: nn.Module,
    normed: Tensor,
    captured: dict[int, Tensor],
    logits_dtype: torch.dtype | None,
    last_logits_only: bool,
    final_hidden: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """A target's logits and its captured hidden states, from the final normed output and the
    residual stream after each captured layer (HF's last hidden_states entry is the normed output).
    `final_hidden`: the normed rows in place of the logits, for a caller that applies the LM head
    itself a chunk at a time (prompt logprobs)."""
    last = len(model.layers) - 1
    if last in captured:
        captured[last] = normed
    hidden = torch.cat([captured[i] for i in model.capture_layers], dim=-1) if captured else None
    if final_hidden:
        return normed, hidden
    logits = model.lm_head(normed[-1:] if last_logits_only else normed)
    return (logits if logits_dtype is None else logits.to(logits_dtype)), hidden


class Qwen3(nn.Module):
    """The target model (a `models.target.Target`). `forward` returns logits and the captured hidden
    states."""

    graphable = True

    def __init__(self, cfg: Qwen3Config) -> None:
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.k_cache: Tensor | None = None
        self.v_cache: Tensor | None = None
        self.capture_layers: tuple[int, ...] = ()

    def fuse(self) -> None:
        """Fused QKV and gate/up projections for inference (done by the loader; training keeps HF's)."""
        for layer in self.layers:
            layer.fuse()

    def setup_caches(self, max_context: int, capture_layers: tuple[int, ...] = (), slots: int = 1) -> None:
        """Allocate the KV caches (one per slot; `k_cache` is slot 0's) and RoPE tables once, on the
        weights' device and dtype."""
        cfg, w = self.config, self.embed_tokens.weight
        shape = (slots, cfg.num_hidden_layers, cfg.num_key_value_heads, max_context, cfg.head_dim)
        self.k_caches = torch.zeros(shape, device=w.device, dtype=w.dtype)
        self.v_caches = torch.zeros(shape, device=w.device, dtype=w.dtype)
        self.k_cache, self.v_cache = self.k_caches[0], self.v_caches[0]
        self.cos, self.sin = rope_tables(cfg.head_dim, cfg.rope_theta, max_context, w.device)
        self.capture_layers = capture_layers

    @property
    def max_context(self) -> int:
        return 0 if self.k_cache is None else self.k_cache.shape[2]

    def plan(
        self, parents: Tensor, depth: Tensor, backend: Backend[Any, Any, Any], chain: bool
    ) -> TreeInputs:
        """A verify pass's tree: attention's visibility (a chain is causal and needs none)."""
        return TreeInputs(chain, None if chain else backend.tree_visibility(parents, depth))

    def snapshot(self, slots: Sequence[int] = (0,)) -> Callable[[], None]:
        """Nothing to put back after a captured round: the K/V rows past the context are scratch."""
        return lambda: None

    def forward(
        self,
        tokens: Tensor,
        input_pos: Tensor,
        context_len: int | Tensor,
        tree: TreeInputs | None,
        backend: Backend,
        capture: bool = True,
        *,
        key_bound: int | None = None,
        logits_dtype: torch.dtype | None = torch.float32,
        last_logits_only: bool = False,
        final_hidden: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """tokens, input_pos: [T] -> logits [T, V], hidden [T, len(capture_layers) * hidden].

        The T new rows go to cache rows `context_len ..`; row i sees rows `[0, context_len)` and the
        new rows that `tree` allows (None: causal). `context_len` may be a 0-d device tensor
        (graph capture) with `key_bound` the most keys it can reach. Logits come in
        `logits_dtype` (None: the model's own, when only their argmax is needed), for every row or
        only the last (a prefill: [1, V] instead of a [T, V] tensor that can outgrow the KV cache),
        or, with `final_hidden`, no logits but the final normed rows [T, hidden].
        """
        part = Part(0, tokens, input_pos, context_len, tree, key_bound)
        return self.forward_parts(
            [part],
            backend,
            capture,
            logits_dtype=logits_dtype,
            last_logits_only=last_logits_only,
            final_hidden=final_hidden,
        )

    def forward_parts(
        self,
        parts: Sequence[Part] | Forest,
        backend: Backend,
        capture: bool = True,
        *,
        logits_dtype: torch.dtype | None = torch.float32,
        last_logits_only: bool = False,
        final_hidden: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Several sequences' rows in one pass (each part as `forward` does its rows, in its own
        slot), outputs in the parts' order. The projections and the MLP run over every part's rows
        at once (one read of the weights); q/k norm + RoPE and attention run per part, over its own
        cache and context length (the existing kernels, one launch per part), or, on a backend with
        `attention_parts`, once per layer over every part's rows (padded). A `Forest` in place of the
        parts: P sequences' trees (or `ar` steps) from device tensors alone, which a graph can
        capture (on a backend with `attention_parts`)."""
        if self.k_cache is None or self.v_cache is None:
            raise RuntimeError("call setup_caches(max_context) before forward")
        if isinstance(parts, Forest):
            tokens, batch, parts = parts.tokens.reshape(-1), SlotRows.of_forest(parts), []
        else:
            parts = [p.resolved() for p in parts]
            tokens = parts[0].tokens if len(parts) == 1 else torch.cat([p.tokens for p in parts])
            batch = slot_rows(parts, backend)  # one attention call for all parts, or None
        eps = self.config.rms_norm_eps
        captured: dict[int, Tensor] = {}
        mask = batch.mask(backend) if batch is not None else None
        weight, group = self._norm_before(0)
        h, x = norm_rows(backend, self.embed_tokens(tokens), weight, eps, None, group)
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            qkv = attn.qkv(h, backend)
            if batch is not None:
                kc, vc = self.k_caches[:, i], self.v_caches[:, i]
                q = attn.rope_slots(qkv, self.cos, self.sin, batch, kc, vc, backend)
                out = attend_slots(q, batch, mask, kc, vc, backend)
            else:
                out = per_part(qkv, parts, partial(self._attend, i, backend), dim=1)
            post, group = layer.post_attention_layernorm.weight, act_group(layer.mlp.gate_up_proj)
            h, x = norm_rows(backend, attn.output(out, backend), post, eps, x, group)
            weight, group = self._norm_before(i + 1)
            h, x = norm_rows(backend, layer.mlp(h, backend), weight, eps, x, group)
            if capture and i in self.capture_layers:  # x: the residual stream after layer i
                captured[i] = x
        return outputs(self, h, captured, logits_dtype, last_logits_only, final_hidden)

    def _norm_before(self, layer: int) -> tuple[Tensor, int | None]:
        """The weight of the norm before `layer` (the final norm past the last) and the activation
        group its readers' FP8 linears share (`quant.act_group`; None past the last: the LM head)."""
        if layer == len(self.layers):
            return self.norm.weight, None
        norm = self.layers[layer].input_layernorm
        return norm.weight, act_group(self.layers[layer].self_attn.qkv_proj)

    def _attend(self, layer: int, backend: Backend, part: Part, qkv: Tensor) -> Tensor:
        """One part's attention in `layer` from its projection rows: [Hq, T, D]."""
        attn = self.layers[layer].self_attn
        kc, vc = self.k_caches[part.slot, layer], self.v_caches[part.slot, layer]
        q = attn.rope(qkv, self.cos, self.sin, part.input_pos, kc, vc, part.context_len, backend)
        visibility = part.tree.visibility if part.tree is not None else None
        return backend.attention(
            q, kc, vc, part.context_len, visibility, attn.head_dim**-0.5, key_bound=part.key_bound
        )

    def commit(
        self,
        context_len: int | Tensor,
        tree: TreeInputs,
        path: Tensor,
        path_len: Tensor,
        backend: Backend,
        slot: int = 0,
    ) -> None:
        """After a verify pass: the accepted K/V rows of `slot` into place (a chain's already are)."""
        if not tree.chain:
            backend.compact(self.k_caches[slot], self.v_caches[slot], context_len, path, path_len)

    def commit_forest(self, forest: Forest, paths: Tensor, path_lens: Tensor, backend: Backend) -> None:
        """After a forest's verify pass: every sequence's accepted K/V rows into place in its slot,
        in one call and from device tensors alone (paths [P, N] padded with -1, path_lens [P])."""
        if not all(tree.chain for tree in forest.trees):
            backend.compact_forest(
                self.k_caches, self.v_caches, forest.slots, forest.context_lens, paths, path_lens
            )
