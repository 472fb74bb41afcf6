"""Qwen3.5 / Qwen3.6 hybrid decoder: Gated DeltaNet layers between gated full-attention layers.

As transformers' `qwen3_5` defines it: RMSNorms scale by (1 + weight); full attention has a sigmoid
output gate (the second half of each q_proj head), q/k norms and RoPE on the first
`partial_rotary_factor` of each head; Gated DeltaNet layers project q, k, v through a short causal
conv1d + silu, decay by g = -exp(A_log) softplus(a + dt_bias), write with beta = sigmoid(b), and
leave through a gated RMSNorm (silu(z)) and `out_proj`.

State per sequence (one per cache slot): the full-attention layers' KV cache (static, written by row as in `Qwen3`), and
per Gated DeltaNet layer a conv state (the last K-1 conv inputs) and a recurrent state [Hv, Dk, Dv]
in fp32. `forward` without a tree is a committed chain (prefill, `ar`): it advances the states.
With a tree (`plan`) it verifies the tree (a chain is a tree too): every node reads the states along
its own root path (`gated_delta.py`), nothing is advanced, and `commit` then moves the states along
the accepted path from what the pass staged, with no second target pass.

For inference (`fuse`, at load) each layer's projections are one matmul and every norm scale is
precomputed, and the layers run on the backend's fused seams, as the dense layers do. Layer kinds
are chosen once, at build time: a `DeltaNetLayer` or an `AttentionLayer` per `layer_types` entry.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import accumulate
from typing import Any

import torch
from torch import Tensor, nn

from ddtree_runtime.backend import Backend
from ddtree_runtime.config import Qwen3_5Config
from ddtree_runtime.gated_delta import GdnSpec
from ddtree_runtime.models.qwen3 import MLP, _fused, linear, outputs, rope_tables
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
from ddtree_runtime.quant import Fp8Input, Produced, act_group, norm_rows, produced_rows


class RMSNorm(nn.Module):
    """Qwen3.5's RMSNorm: weights stored around zero and applied as (1 + weight), in fp32."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))
        self.fused_scale: Tensor | None = None

    def fuse(self) -> None:
        self.fused_scale = 1.0 + self.weight.detach().float()

    @property
    def scale(self) -> Tensor:
        """(1 + weight) in fp32: what the backend's fused norm multiplies by (cached by `fuse`)."""
        return self.fused_scale if self.fused_scale is not None else 1.0 + self.weight.float()

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.scale).to(x.dtype)


class GatedRMSNorm(nn.Module):
    """RMSNorm of the DeltaNet output, times silu(z) (the backends apply it: `gated_delta.gated_norm`)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))


@dataclass(frozen=True)
class _Group:
    """Parts of a batched pass that every DeltaNet layer takes in one call: its one-token committed
    parts (the `ar` rows: `gdn_steps`), or two or more verify parts of one node count (a forest:
    `gdn_forest`)."""

    rows: Tensor  # [R] the parts' rows in the pass
    slots: Tensor  # [P] their cache slots
    plan: Any = None  # a forest's stacked plan (`gdn_forest_plan`); None: the steps
    stagings: Any = None  # a forest: every slot's staging of its node count

    @classmethod
    def of(cls, placed: list[tuple[int, Part]], plan: Any = None, stagings: Any = None) -> _Group:
        """The group of `placed` parts (with their first rows)."""
        device = placed[0][1].tokens.device
        rows = [start + i for start, part in placed for i in range(part.rows)]
        slots = [part.slot for _, part in placed]
        return cls(torch.tensor(rows, device=device), torch.tensor(slots, device=device), plan, stagings)


@dataclass(frozen=True)
class _Batched:
    """A batched pass's parts as its DeltaNet layers take them: in groups (`_Group`), on a backend
    with the batched calls, and every other part (a longer chain, a tree of a size that no other
    part of the pass has) on its own."""

    groups: list[_Group]
    others: list[tuple[int, Part]]  # every other part, with its first row

    @classmethod
    def of(
        cls, parts: Sequence[Part], backend: Backend[Any, Any, Any], stagings: dict[int, Any]
    ) -> _Batched | None:
        """The groups of a pass of several parts (`stagings`: every slot's, by verify size); None for
        one part (its own path, graphed on CUDA) or when no call takes more than one part."""
        if len(parts) == 1:
            return None
        starts = accumulate((p.rows for p in parts), initial=0)
        placed = list(zip(starts, parts, strict=False))  # (first row, part); the total is left over
        taken: set[int] = set()  # the first rows of the grouped parts
        groups = []
        steps = [(r, p) for r, p in placed if p.tree is None and p.rows == 1]
        if steps and hasattr(backend, "gdn_steps"):
            groups.append(_Group.of(steps))
            taken.update(r for r, _ in steps)
        sizes = Counter(p.rows for p in parts if p.tree is not None)
        shared = [n for n, count in sizes.items() if count > 1] if hasattr(backend, "gdn_forest") else []
        for n in shared:
            trees = [(r, p) for r, p in placed if p.tree is not None and p.rows == n]
            plan = backend.gdn_forest_plan([p.tree.gdn for _, p in trees if p.tree is not None])
            groups.append(_Group.of(trees, plan, stagings[n]))
            taken.update(r for r, _ in trees)
        if not groups:
            return None
        return cls(groups, [(r, p) for r, p in placed if r not in taken])


@dataclass
class _Pass:
    """What every layer of one forward pass reads: the parts (each with its slot, positions,
    length, key bound and tree), each verified part's DeltaNet staging, by slot, and, in a pass of
    several parts, its DeltaNet groups and, on a backend with `attention_parts`, the parts' rows
    laid out for one attention call per layer."""

    backend: Backend[Any, Any, Any]
    parts: list[Part]
    stagings: dict[int, Any]
    batched: _Batched | None = None
    batch: SlotRows | None = None
    mask: Any = None


class GatedAttention(nn.Module):
    def __init__(self, cfg: Qwen3_5Config) -> None:
        super().__init__()
        d, bias = cfg.head_dim, cfg.attention_bias
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, d
        self.q_proj = nn.Linear(cfg.hidden_size, self.n_heads * d * 2, bias=bias)  # query | gate per head
        self.k_proj = nn.Linear(cfg.hidden_size, self.n_kv * d, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.n_kv * d, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * d, cfg.hidden_size, bias=bias)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.qkv_proj: nn.Linear | None = None

    def fuse(self) -> None:
        self.qkv_proj = _fused(self.q_proj, self.k_proj, self.v_proj)
        del self.q_proj, self.k_proj, self.v_proj
        self.q_norm.fuse()
        self.k_norm.fuse()

    def forward(
        self, x: Tensor | Fp8Input, cos: Tensor, sin: Tensor, k_caches: Tensor, v_caches: Tensor, p: _Pass
    ) -> Tensor:
        # x: [T, hidden]; cos, sin: [S_max, rotary_dim] tables; k_caches, v_caches: [slots, Hkv, S_max, D]
        backend = p.backend
        if self.qkv_proj is not None:
            qkv = linear(self.qkv_proj, x, backend)  # [T, Hq 2D + 2 Hkv D]
        else:
            assert isinstance(x, Tensor), "unfused projections read unquantized rows"
            qkv = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)
        if p.batch is not None:
            out = self._attend_slots(qkv, cos, sin, k_caches, v_caches, p)
        else:
            out = per_part(qkv, p.parts, partial(self._attend, cos, sin, k_caches, v_caches, backend), dim=1)
        gated = backend.attention_gate(out, qkv, self.n_heads, act_group(self.o_proj))  # [T, Hq D]
        return linear(self.o_proj, produced_rows(gated), backend)

    def _rope(
        self,
        qkv: Tensor,
        cos: Tensor,
        sin: Tensor,
        positions: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        context_len: int | Tensor,
        backend: Backend[Any, Any, Any],
    ) -> Tensor:
        """Gated queries [T, Hq, D] of a projection `qkv` (q/k norm and partial RoPE); its keys and
        values go to cache rows `context_len ..`."""
        return backend.qk_rope(
            qkv,
            self.q_norm.scale,
            self.k_norm.scale,
            self.q_norm.eps,
            cos,
            sin,
            positions,
            k_cache,
            v_cache,
            context_len,
            self.n_heads,
            gated=True,
        )

    def _attend_slots(
        self, qkv: Tensor, cos: Tensor, sin: Tensor, k_caches: Tensor, v_caches: Tensor, p: _Pass
    ) -> Tensor:
        """Every part's attention in one q/k norm + RoPE step (into scratch K/V, then one scatter
        into the slots) and one `attention_parts` call: [Hq, T, D], before the output gate."""
        assert p.batch is not None
        t, d = qkv.shape[0], self.head_dim
        k_new, v_new = qkv.new_empty(self.n_kv, t, d), qkv.new_empty(self.n_kv, t, d)
        start = as_device_length(0, qkv.device)
        q = self._rope(qkv, cos, sin, p.batch.positions, k_new, v_new, start, p.backend)
        write_slots(p.batch, k_new, v_new, k_caches, v_caches)
        return attend_slots(q.transpose(0, 1), p.batch, p.mask, k_caches, v_caches, p.backend)

    def _attend(
        self,
        cos: Tensor,
        sin: Tensor,
        k_caches: Tensor,
        v_caches: Tensor,
        backend: Backend[Any, Any, Any],
        part: Part,
        qkv: Tensor,
    ) -> Tensor:
        """One part's attention from its projection rows, over its slot's cache: [Hq, T, D], before
        the output gate."""
        d = self.head_dim
        k_cache, v_cache = k_caches[part.slot], v_caches[part.slot]
        q = self._rope(qkv, cos, sin, part.input_pos, k_cache, v_cache, part.context_len, backend)
        visibility = part.tree.visibility if part.tree is not None else None
        return backend.attention(
            q.transpose(0, 1),
            k_cache,
            v_cache,
            part.context_len,
            visibility,
            d**-0.5,
            key_bound=part.key_bound,
        )


class GatedDeltaNet(nn.Module):
    def __init__(self, cfg: Qwen3_5Config) -> None:
        super().__init__()
        self.n_k, self.n_v = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        self.dk, self.dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        key_dim, value_dim = self.n_k * self.dk, self.n_v * self.dv
        self.conv_dim = 2 * key_dim + value_dim
        self.kernel = cfg.linear_conv_kernel_dim
        self.in_proj_qkv = nn.Linear(cfg.hidden_size, self.conv_dim, bias=False)
        self.in_proj_z = nn.Linear(cfg.hidden_size, value_dim, bias=False)
        self.in_proj_b = nn.Linear(cfg.hidden_size, self.n_v, bias=False)
        self.in_proj_a = nn.Linear(cfg.hidden_size, self.n_v, bias=False)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, self.kernel, groups=self.conv_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(self.n_v))
        self.A_log = nn.Parameter(torch.zeros(self.n_v))
        self.norm = GatedRMSNorm(self.dv, cfg.rms_norm_eps)
        self.out_proj = nn.Linear(value_dim, cfg.hidden_size, bias=False)
        self.in_proj: nn.Module | None = None
        self.in_proj_gates: nn.Module | None = None
        self.fused_spec: GdnSpec | None = None

    def fuse(self) -> None:
        """One projection `[mixed | z | b | a]` (the layout every backend reads), the spec kept. An
        FP8 export keeps b and a in bf16: then they are a second, small projection beside it."""
        parts = (self.in_proj_qkv, self.in_proj_z, self.in_proj_b, self.in_proj_a)
        if all(type(p) is type(parts[0]) for p in parts):
            self.in_proj = _fused(*parts)
        else:
            self.in_proj, self.in_proj_gates = _fused(*parts[:2]), _fused(*parts[2:])
        del self.in_proj_qkv, self.in_proj_z, self.in_proj_b, self.in_proj_a
        self.fused_spec = self.spec

    @property
    def spec(self) -> GdnSpec:
        """The layer's sizes and small weights, as the backends' DeltaNet seams take them."""
        if self.fused_spec is not None:
            return self.fused_spec
        return GdnSpec(
            self.n_k,
            self.n_v,
            self.dk,
            self.dv,
            self.norm.eps,
            self.conv1d.weight[:, 0],
            self.A_log,
            self.dt_bias,
            self.norm.weight,
        )

    def project(self, x: Tensor | Fp8Input, backend: Backend[Any, Any, Any]) -> Tensor:
        """x [T, hidden] -> [T, C + Hv Dv + 2 Hv]: mixed q|k|v, z, b, a."""
        if self.in_proj is not None:
            out = linear(self.in_proj, x, backend)
            if self.in_proj_gates is None:
                return out
            return torch.cat([out, linear(self.in_proj_gates, x, backend)], dim=-1)
        assert isinstance(x, Tensor), "unfused projections read unquantized rows"
        return torch.cat(
            [self.in_proj_qkv(x), self.in_proj_z(x), self.in_proj_b(x), self.in_proj_a(x)], dim=-1
        )

    def forward(self, x: Tensor, conv_states: Tensor, states: Tensor, slot: int, p: _Pass) -> Tensor:
        """x: [T, hidden]; conv_states: [slots, K-1, C]; states: [slots, Hv, Dk, Dv] fp32, this
        layer's (`slot`: its index among the DeltaNet layers). A chain part advances its sequence's
        states in place; a tree part leaves them and fills the layer's slot of its staging."""
        proj = self.project(x, p.backend)
        # one call that writes every row can quantize them for an FP8 out_proj (its `act_group`)
        fp8_group, mix = act_group(self.out_proj), partial(self._mix, conv_states, states, slot, p)
        if p.batched is not None:
            out = self._mix_batched(conv_states, states, slot, p, p.batched, proj, fp8_group)
        elif len(p.parts) == 1:
            out = mix(p.parts[0], proj, fp8_group)
        else:
            out = per_part(proj, p.parts, mix)
        return linear(self.out_proj, produced_rows(out), p.backend)

    def _mix_batched(
        self,
        conv_states: Tensor,
        states: Tensor,
        slot: int,
        p: _Pass,
        batched: _Batched,
        proj: Tensor,
        fp8_group: int | None,
    ) -> Produced:
        """A batched pass: each group of parts in one call (the steps, each forest), every other
        part on its own (quantized for the FP8 out_proj only when one call writes every row)."""
        if len(batched.groups) == 1 and not batched.others:  # one call over every row, in order
            return self._mix_group(conv_states, states, slot, p, batched.groups[0], proj, fp8_group)
        out = proj.new_empty(proj.shape[0], self.n_v * self.dv)
        for group in batched.groups:
            out[group.rows] = self._mix_group(conv_states, states, slot, p, group, proj[group.rows])
        for start, part in batched.others:
            rows = slice(start, start + part.rows)
            out[rows] = self._mix(conv_states, states, slot, p, part, proj[rows])
        return out

    def _mix_group(
        self,
        conv_states: Tensor,
        states: Tensor,
        slot: int,
        p: _Pass,
        group: _Group,
        proj: Tensor,
        fp8_group: int | None = None,
    ) -> Produced:
        if group.plan is None:
            return p.backend.gdn_steps(proj, self.spec, conv_states, states, group.slots, fp8_group)
        return p.backend.gdn_forest(
            proj, self.spec, conv_states, states, group.slots, group.plan, group.stagings, slot, fp8_group
        )

    def _mix(
        self,
        conv_states: Tensor,
        states: Tensor,
        slot: int,
        p: _Pass,
        part: Part,
        proj: Tensor,
        fp8_group: int | None = None,
    ) -> Produced:
        conv_state, state = conv_states[part.slot], states[part.slot]
        if part.tree is None:
            return p.backend.gdn_chain(proj, self.spec, conv_state, state, fp8_group)
        staging = p.stagings[part.slot]
        return p.backend.gdn_tree(proj, self.spec, conv_state, state, part.tree.gdn, staging, slot, fp8_group)


class _Layer(nn.Module):
    """The parts every hybrid layer has: its MLP and the two norms around the mixer."""

    def __init__(self, cfg: Qwen3_5Config) -> None:
        super().__init__()
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def fuse(self) -> None:
        self.mlp.fuse()
        self.input_layernorm.fuse()
        self.post_attention_layernorm.fuse()


class DeltaNetLayer(_Layer):
    def __init__(self, cfg: Qwen3_5Config) -> None:
        super().__init__(cfg)
        self.linear_attn = GatedDeltaNet(cfg)

    def fuse(self) -> None:
        super().fuse()
        self.linear_attn.fuse()

    def mix_readers(self) -> tuple[nn.Module | None, ...]:
        """The linears that read the mixer's input (the norm's output)."""
        return (self.linear_attn.in_proj, self.linear_attn.in_proj_gates)

    def mix(self, h: Tensor | Fp8Input, model: Qwen3_5, slot: int, p: _Pass) -> Tensor:
        return self.linear_attn(h, model.conv_states[:, slot], model.rec_states[:, slot], slot, p)


class AttentionLayer(_Layer):
    def __init__(self, cfg: Qwen3_5Config) -> None:
        super().__init__(cfg)
        self.self_attn = GatedAttention(cfg)

    def fuse(self) -> None:
        super().fuse()
        self.self_attn.fuse()

    def mix_readers(self) -> tuple[nn.Module | None, ...]:
        """The linears that read the mixer's input (the norm's output)."""
        return (self.self_attn.qkv_proj,)

    def mix(self, h: Tensor | Fp8Input, model: Qwen3_5, slot: int, p: _Pass) -> Tensor:
        return self.self_attn(h, model.cos, model.sin, model.k_caches[:, slot], model.v_caches[:, slot], p)


LAYERS = {"linear_attention": DeltaNetLayer, "full_attention": AttentionLayer}


class Qwen3_5(nn.Module):
    """The hybrid target (a `models.target.Target`). `forward` returns logits and the captured
    hidden states, as `Qwen3`."""

    graphable = True

    def __init__(self, cfg: Qwen3_5Config) -> None:
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(LAYERS[kind](cfg) for kind in cfg.layer_types)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.k_cache: Tensor | None = None
        self.v_cache: Tensor | None = None
        self.capture_layers: tuple[int, ...] = ()
        self.slot = {layer: i for i, layer in enumerate(cfg.full_layers)}
        self.slot.update({layer: i for i, layer in enumerate(cfg.linear_layers)})
        # each verify size's staging buffers (per backend, for every cache slot; `commit` reads a
        # slot's of its path's size)
        self._stagings: dict[tuple[str, int], Any] = {}

    def fuse(self) -> None:
        """Fused projections and precomputed norm scales for inference (done by the loader; training
        keeps HF's)."""
        for layer in self.layers:
            layer.fuse()
        self.norm.fuse()

    def setup_caches(self, max_context: int, capture_layers: tuple[int, ...] = (), slots: int = 1) -> None:
        """Per slot: the KV cache of the full-attention layers, conv + recurrent states of the
        DeltaNet layers (`k_cache`, `conv_state`, ... are slot 0's)."""
        cfg, w = self.config, self.embed_tokens.weight
        shape = (slots, len(cfg.full_layers), cfg.num_key_value_heads, max_context, cfg.head_dim)
        self.k_caches = torch.zeros(shape, device=w.device, dtype=w.dtype)
        self.v_caches = torch.zeros(shape, device=w.device, dtype=w.dtype)
        n_lin = len(cfg.linear_layers)
        conv_dim = 2 * cfg.linear_num_key_heads * cfg.linear_key_head_dim
        conv_dim += cfg.linear_num_value_heads * cfg.linear_value_head_dim
        self.conv_states = torch.zeros(
            slots, n_lin, cfg.linear_conv_kernel_dim - 1, conv_dim, device=w.device, dtype=w.dtype
        )
        self.rec_states = torch.zeros(
            slots,
            n_lin,
            cfg.linear_num_value_heads,
            cfg.linear_key_head_dim,
            cfg.linear_value_head_dim,
            device=w.device,
            dtype=torch.float32,
        )
        self.k_cache, self.v_cache = self.k_caches[0], self.v_caches[0]
        self.conv_state, self.rec_state = self.conv_states[0], self.rec_states[0]
        self.cos, self.sin = rope_tables(cfg.rotary_dim, cfg.rope_theta, max_context, w.device)
        self.capture_layers = capture_layers
        self._stagings = {}

    @property
    def max_context(self) -> int:
        return 0 if self.k_cache is None else self.k_cache.shape[2]

    def reset(self, slot: int = 0) -> None:
        """Zero a slot's recurrent and conv states before a new sequence (the KV rows are overwritten)."""
        self.conv_states[slot].zero_()
        self.rec_states[slot].zero_()

    def snapshot(self, slots: Sequence[int] = (0,)) -> Callable[[], None]:
        """A function that puts the recurrent and conv states of `slots` back as they are now: a
        captured round (graph warm-up and capture) or a profile runs rounds that must leave no trace."""
        ids = list(slots)
        saved = (self.conv_states[ids].clone(), self.rec_states[ids].clone())

        def restore() -> None:
            self.conv_states[ids] = saved[0]
            self.rec_states[ids] = saved[1]

        return restore

    def plan(
        self, parents: Tensor, depth: Tensor, backend: Backend[Any, Any, Any], chain: bool
    ) -> TreeInputs:
        """A verify pass's tree: attention's visibility and the DeltaNet plan, once for all layers."""
        visibility = None if chain else backend.tree_visibility(parents, depth)
        return TreeInputs(
            chain, visibility, backend.gdn_plan(parents, depth, self.config.linear_conv_kernel_dim)
        )

    def _staging(self, nodes: int, backend: Backend[Any, Any, Any]) -> Any:
        """Every slot's DeltaNet staging of a verify pass of `nodes` nodes (`[slot]`: a slot's),
        allocated once per size."""
        key = (backend.name, nodes)
        if key not in self._stagings:
            layer = self.layers[self.config.linear_layers[0]].linear_attn
            self._stagings[key] = backend.gdn_staging(
                len(self.config.linear_layers),
                nodes,
                layer.spec,
                self.embed_tokens.weight.dtype,
                slots=self.rec_states.shape[0],
            )
        return self._stagings[key]

    def forward(
        self,
        tokens: Tensor,
        input_pos: Tensor,
        context_len: int | Tensor,
        tree: TreeInputs | None,
        backend: Backend[Any, Any, Any],
        capture: bool = True,
        *,
        key_bound: int | None = None,
        logits_dtype: torch.dtype | None = torch.float32,
        last_logits_only: bool = False,
        final_hidden: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """tokens, input_pos: [T] -> logits [T, V], hidden [T, len(capture_layers) * hidden].

        Without a tree the T tokens extend the committed sequence (a fresh sequence when
        `context_len` is 0). With one (`plan`) they are a tree to verify; call `commit` afterwards.
        `context_len`, `key_bound`, `logits_dtype`, `last_logits_only` and `final_hidden` are as for `Qwen3`.
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
        backend: Backend[Any, Any, Any],
        capture: bool = True,
        *,
        logits_dtype: torch.dtype | None = torch.float32,
        last_logits_only: bool = False,
        final_hidden: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Several sequences' rows in one pass, each part as `forward` does its rows in its own slot.
        The projections and MLPs run over every part's rows at once (one read of the weights); the
        DeltaNet recurrence of each part over its slot's states (a tree: its own plan and staging),
        or, on a backend with `gdn_steps`, of every one-token chain (`ar`) in one call per layer,
        and, with `gdn_forest`, of every verify part of a size shared by several in one call;
        attention per part, or, on a backend with `attention_parts`, once per layer over every
        part's rows (padded). A `Forest` in place of the parts: P sequences' trees of one size
        (`gdn_forest`) or `ar` steps (`gdn_steps`) from device tensors alone, which a graph can
        capture (on a backend with the batched calls)."""
        if self.k_cache is None or self.v_cache is None:
            raise RuntimeError("call setup_caches(max_context) before forward")
        if isinstance(parts, Forest):
            p = _Pass(
                backend, [], {}, _Batched([self._forest_group(parts, backend)], []), SlotRows.of_forest(parts)
            )
            tokens = parts.tokens.reshape(-1)
        else:
            for part in parts:
                if isinstance(part.context_len, int) and part.context_len == 0:
                    self.reset(part.slot)
            by_size = {p.rows: self._staging(p.rows, backend) for p in parts if p.tree is not None}
            stagings = {p.slot: by_size[p.rows][p.slot] for p in parts if p.tree is not None}
            resolved = [part.resolved() for part in parts]
            p = _Pass(backend, resolved, stagings, _Batched.of(resolved, backend, by_size))
            tokens = parts[0].tokens if len(parts) == 1 else torch.cat([part.tokens for part in parts])
            p.batch = slot_rows(p.parts, backend)  # one attention call for all parts, or None
        p.mask = p.batch.mask(backend) if p.batch is not None else None
        eps = self.config.rms_norm_eps
        captured: dict[int, Tensor] = {}
        scale, group = self._norm_before(0)
        h, x = norm_rows(backend, self.embed_tokens(tokens), scale, eps, None, group)
        for i, layer in enumerate(self.layers):
            out = layer.mix(h, self, self.slot[i], p)
            post, group = layer.post_attention_layernorm.scale, act_group(layer.mlp.gate_up_proj)
            h, x = norm_rows(backend, out, post, eps, x, group)
            scale, group = self._norm_before(i + 1)
            h, x = norm_rows(backend, layer.mlp(h, backend), scale, eps, x, group)
            if capture and i in self.capture_layers:  # x: the residual stream after layer i
                captured[i] = x
        return outputs(self, h, captured, logits_dtype, last_logits_only, final_hidden)

    def _forest_group(self, forest: Forest, backend: Backend[Any, Any, Any]) -> _Group:
        """A forest's rows as every DeltaNet layer takes them: its trees in one `gdn_forest` call
        (their plans stacked once), or its one-token steps in one `gdn_steps` call."""
        p, n = forest.shape
        rows = torch.arange(p * n, device=forest.tokens.device)
        if not forest.trees:
            assert n == 1, "a forest without trees is a batched `ar` step"
            return _Group(rows, forest.slots)
        plan = backend.gdn_forest_plan([t.gdn for t in forest.trees])
        return _Group(rows, forest.slots, plan, self._staging(n, backend))

    def _norm_before(self, layer: int) -> tuple[Tensor, int | None]:
        """The (1 + w) scale of the norm before `layer` (the final norm past the last) and the
        activation group its readers' FP8 linears share (`quant.act_group`; None past the last)."""
        if layer == len(self.layers):
            return self.norm.scale, None
        return self.layers[layer].input_layernorm.scale, act_group(*self.layers[layer].mix_readers())

    def commit(
        self,
        context_len: int | Tensor,
        tree: TreeInputs,
        path: Tensor,
        path_len: Tensor,
        backend: Backend[Any, Any, Any],
        slot: int = 0,
    ) -> None:
        """After a verify pass: a slot's DeltaNet states along the accepted path, then (for a tree)
        its accepted K/V rows into place, as for dense models. path [N] padded with -1; path_len 0-d."""
        conv_states, states = self.conv_states[slot], self.rec_states[slot]
        staging = self._staging(path.shape[0], backend)[slot]  # where its verify pass staged
        backend.gdn_commit(conv_states, states, staging, tree.gdn, path, path_len)
        if not tree.chain:
            backend.compact(self.k_caches[slot], self.v_caches[slot], context_len, path, path_len)

    def commit_forest(
        self, forest: Forest, paths: Tensor, path_lens: Tensor, backend: Backend[Any, Any, Any]
    ) -> None:
        """After a forest's verify pass: every sequence's DeltaNet states along its accepted path,
        then its accepted K/V rows into place, each in its slot, one call each for all sequences and
        from device tensors alone (paths [P, N] padded with -1, path_lens [P])."""
        assert forest.trees, "a forest without trees (`ar` steps) advanced its states in its pass"
        stagings = self._staging(forest.shape[1], backend)  # where the forest's pass staged
        plans = [tree.gdn for tree in forest.trees]
        backend.gdn_commit_forest(
            self.conv_states, self.rec_states, stagings, plans, forest.slots, paths, path_lens
        )
        if not all(tree.chain for tree in forest.trees):
            backend.compact_forest(
                self.k_caches, self.v_caches, forest.slots, forest.context_lens, paths, path_lens
            )
