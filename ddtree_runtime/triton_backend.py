"""TritonBackend: the hot-path seams of `ddtree_runtime.backend.TorchBackend`, on the GPU kernels.

Same method names, arguments and results as TorchBackend (the oracle), composed of the
`ddtree_kernels` kernels (DDTree, Ringel & Romano, arXiv 2604.12989): `tree_visibility` returns
ancestor bitmasks (`TreeVisibility`) instead of a dense [N, N] mask, `gdn_plan` a `TreePlan`, and
everything stays on the device with no host sync. `select_backend` picks this class on CUDA.

A committed chain of more than one token through a Gated DeltaNet layer (the prefill) goes through
`flash-linear-attention`'s chunked kernel, the one vLLM and SGLang call; a single token (`ar`)
through our fused step (one token of every `ar` sequence of a batched pass in one launch), and a
tree (verify) through our tree kernel (the trees of one size of a batched pass in one launch pair).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from fla.ops.gated_delta_rule import chunk_gated_delta_rule
from torch import Tensor

from ddtree_kernels import fp8_cublas
from ddtree_kernels.attention_gate import attention_gate, attention_gate_fits, attention_gate_fp8
from ddtree_kernels.fp8_gemm import fp8_gemm
from ddtree_kernels.fp8_skinny import fp8_skinny
from ddtree_kernels.gated_rms_norm import gated_norm_fits, gated_rms_norm, gated_rms_norm_fp8
from ddtree_kernels.gdn_commit import gdn_commit
from ddtree_kernels.gdn_inputs import gdn_inputs
from ddtree_kernels.gdn_step import gdn_step, gdn_step_fits
from ddtree_kernels.gdn_tree import ForestPlan, TreePlan, gdn_forest, gdn_tree, tree_plan
from ddtree_kernels.host import MAX_ROWS, QuantizedRows, fp8_tensor_cores
from ddtree_kernels.kv_compact import compact, compact_forest
from ddtree_kernels.qk_rope import qk_rope
from ddtree_kernels.rms_norm import rms_norm, rms_norm_fp8
from ddtree_kernels.silu_mul import silu_mul, silu_mul_fp8
from ddtree_kernels.skinny_matmul import SKINNY_MAX_N, skinny_matmul
from ddtree_kernels.tree_attention import (
    PartsVisibility,
    TreeVisibility,
    parts_visibility,
    tree_attention,
    tree_attention_parts,
    tree_visibility,
)
from ddtree_kernels.tree_build import build_tree, candidate_pairs
from ddtree_kernels.tree_walk import tree_walk, tree_walk_parts
from ddtree_runtime.fp8 import fp8_linear_reference
from ddtree_runtime.gated_delta import GdnSpec, advance_conv


@dataclass(frozen=True)
class GdnStaging:
    """One verify pass's DeltaNet staging, every layer stacked so that the commit is one launch."""

    k: Tensor  # [L, N, Hk, Dk], the model dtype
    x: Tensor  # [L, N, C] raw conv inputs, the model dtype
    d: Tensor  # [L, Hv, N, Dv] fp32 corrections
    gsum: Tensor  # [L, Hv, N] fp32 path sums


@dataclass(frozen=True)
class GdnStagings:
    """Every cache slot's staging for one verify size, stacked ``[S, ...]`` (fields as `GdnStaging`):
    ``[slot]`` is a slot's own (views, which its commit reads), and a forest stages its trees into
    their slots in one launch."""

    k: Tensor  # [S, L, N, Hk, Dk]
    x: Tensor  # [S, L, N, C]
    d: Tensor  # [S, L, Hv, N, Dv]
    gsum: Tensor  # [S, L, Hv, N]

    def __getitem__(self, slot: int) -> GdnStaging:
        return GdnStaging(self.k[slot], self.x[slot], self.d[slot], self.gsum[slot])

    def __len__(self) -> int:
        return self.k.shape[0]


def _spec_inputs(
    proj: Tensor, spec: GdnSpec, conv_state: Tensor, **options: Tensor | bool | None
) -> tuple[Tensor, ...]:
    """`gdn_inputs` with the layer's conv weight, decay parameters and head shape from its spec."""
    return gdn_inputs(proj, conv_state, spec.conv_weight, spec.a_log, spec.dt_bias, spec.heads, **options)


def _gated_norm(o: Tensor, proj: Tensor, spec: GdnSpec, group: int | None) -> Tensor | QuantizedRows:
    """The DeltaNet output's gated norm, o [T, Hv, Dv] -> [T, Hv Dv]: quantized by `group` columns
    for an FP8 out_proj when whole groups fit the kernel's programs, else in the model dtype."""
    if group is not None and gated_norm_fits(group, spec.n_v, spec.dv):
        return gated_rms_norm_fp8(o, proj, spec.conv_dim, spec.norm_weight, spec.eps, group)
    return gated_rms_norm(o, proj, spec.conv_dim, spec.norm_weight, spec.eps)


def _step(
    inputs: tuple[Tensor, ...],
    state: Tensor,
    proj: Tensor,
    spec: GdnSpec,
    group: int | None,
    slots: Tensor | None = None,
) -> Tensor | QuantizedRows:
    """The fused `ar` step (one token per sequence): its heads quantized by `group` columns for an
    FP8 out_proj when whole groups fit a head, else in the model dtype."""
    fits = group is not None and gdn_step_fits(group, spec.dv)
    norm = (spec.conv_dim, spec.norm_weight, spec.eps)
    return gdn_step(*inputs, state, proj, *norm, slots=slots, group=group if fits else None)


class TritonBackend:
    """The Triton kernels behind TorchBackend's interface; holds the per-budget candidate tables."""

    name = "triton"
    capturable = True

    def __init__(self) -> None:
        self._pairs: dict[tuple[int, int, torch.device], tuple[Tensor, Tensor]] = {}

    def tree_visibility(self, parents: Tensor, depth: Tensor) -> TreeVisibility:
        """Ancestor-or-self bitmasks int32 [N, ceil(N / 32)], built by one launch."""
        return tree_visibility(parents, depth)

    rms_norm = staticmethod(rms_norm)
    rms_norm_fp8 = staticmethod(rms_norm_fp8)

    @staticmethod
    def linear(x: Tensor, weight: Tensor) -> Tensor:
        """x @ weight.T: the skinny kernel for a few rows and a projection-sized weight, else cuBLAS."""
        if x.shape[0] <= MAX_ROWS and weight.shape[0] <= SKINNY_MAX_N and x.stride(-1) == 1:
            return skinny_matmul(x, weight)
        return F.linear(x, weight)

    @staticmethod
    def fp8_linear(
        x: Tensor | QuantizedRows, weight: Tensor, scale: Tensor, block: tuple[int, int]
    ) -> Tensor:
        """An FP8 target's linear (of rows, or of rows their producer quantized): the skinny kernel
        for a few rows, else the block-scaled GEMM (cuBLAS's for big bf16 trees and prefills where
        it takes Qwen's blocks); the dequantized reference on GPUs without FP8 tensor cores (sm_80)."""
        if not fp8_tensor_cores(weight.device):
            return fp8_linear_reference(x, weight, scale, block)
        if x.shape[0] <= MAX_ROWS:
            return fp8_skinny(x, weight, scale, block)
        if fp8_cublas.serves(x, weight, block):
            return fp8_cublas.fp8_cublas(x, weight, scale)
        return fp8_gemm(x, weight, scale, block)

    qk_rope = staticmethod(qk_rope)

    @staticmethod
    def attention_gate(
        o: Tensor, qkv: Tensor, n_heads: int, group: int | None = None
    ) -> Tensor | QuantizedRows:
        """The gated attention output, quantized by `group` columns for an FP8 o_proj when whole
        groups fit the kernel's programs (Qwen's 128-column groups: two to a head)."""
        if group is not None and attention_gate_fits(group, n_heads, o.shape[-1]):
            return attention_gate_fp8(o, qkv, n_heads, group)
        return attention_gate(o, qkv, n_heads)

    silu_mul = staticmethod(silu_mul)
    silu_mul_fp8 = staticmethod(silu_mul_fp8)

    def attention(
        self,
        q: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        context_len: int | Tensor,
        visibility: TreeVisibility | None,
        scale: float,
        key_bound: int | None = None,
        all_visible: bool = False,
        window: int | None = None,
    ) -> Tensor:
        """q [Hq, N, D] over the context and the visible new rows; [Hq, N, D] in q's dtype."""
        return tree_attention(
            q,
            k_cache,
            v_cache,
            context_len,
            visibility,
            scale,
            key_bound=key_bound,
            all_visible=all_visible,
            window=window,
        )

    @staticmethod
    def parts_mask(
        rows: list[int],
        context_lens: list[int] | Tensor,
        keys: int,
        visibilities: list[TreeVisibility | None],
        all_visible: bool,
        window: int | None,
        device: torch.device,
    ) -> PartsVisibility:
        """What several sequences' rows see (as `attention` for each), for `attention_parts`: each
        one's rows, length and bitmasks on the device, built once per pass."""
        return parts_visibility(rows, context_lens, keys, visibilities, all_visible, window, device)

    @staticmethod
    def attention_parts(
        q: Tensor,
        k_caches: Tensor,
        v_caches: Tensor,
        slots: Tensor | slice,
        mask: PartsVisibility,
        scale: float,
    ) -> Tensor:
        """q [P, Hq, N, D] of several sequences over their slots of one layer's caches
        [S, Hkv, S_max, D]: one launch for all; [P, Hq, N, D] (padding rows undefined)."""
        return tree_attention_parts(q, k_caches, v_caches, slots, mask, scale)

    def build_tree(
        self, draft_logits: Tensor, budget: int, root_token: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """tokens, parents, depth [budget + 1] of the top-budget prefixes (same set as the heap)."""
        key = (budget, min(budget, draft_logits.shape[1]), draft_logits.device)
        if key not in self._pairs:
            self._pairs[key] = candidate_pairs(*key)
        return build_tree(draft_logits, budget, root_token, self._pairs[key])

    def build_trees(self, draft_logits: Tensor, budget: int, roots: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """`build_tree` of P drafts [P, D, V] (roots [P]) -> [P, budget + 1] each; a launch per draft
        (a tree round's graph holds them)."""
        built = [
            self.build_tree(logits, budget, root) for logits, root in zip(draft_logits, roots, strict=True)
        ]
        tokens, parents, depth = (torch.stack(x) for x in zip(*built, strict=True))
        return tokens, parents, depth

    def tree_walk(
        self,
        tokens: Tensor,
        parents: Tensor,
        logits: Tensor,
        temperature: float,
        generator: torch.Generator | None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """path [N], path_len, bonus: the target's own choices followed down the tree."""
        return tree_walk(tokens, parents, logits, temperature, generator)

    @staticmethod
    def tree_walk_parts(tokens: Tensor, parents: Tensor, logits: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The greedy walks of P padded trees [P, N] in two launches: path [P, N], path_len, bonus [P]."""
        return tree_walk_parts(tokens, parents, logits)

    def compact(
        self, k_cache: Tensor, v_cache: Tensor, context_len: int | Tensor, path: Tensor, path_len: Tensor
    ) -> None:
        """Accepted rows into place for every layer of [L, Hkv, S_max, D] caches, one launch."""
        compact(k_cache, v_cache, context_len, path, path_len)

    compact_forest = staticmethod(compact_forest)  # every sequence's rows in its slot: one launch

    def gdn_plan(self, parents: Tensor, depth: Tensor, kernel: int) -> TreePlan:
        """The tree's ancestor structure and conv windows, once for every DeltaNet layer of a pass."""
        return tree_plan(parents, depth, kernel)

    def gdn_staging(
        self, layers: int, nodes: int, spec: GdnSpec, dtype: torch.dtype, slots: int = 1
    ) -> GdnStagings:
        """Stacked buffers for `layers` DeltaNet layers of an `nodes`-node verify pass, per slot."""
        device = spec.conv_weight.device

        def buf(*shape: int, kind: torch.dtype = torch.float32) -> Tensor:
            return torch.empty(slots, layers, *shape, device=device, dtype=kind)

        return GdnStagings(
            k=buf(nodes, spec.n_k, spec.dk, kind=dtype),
            x=buf(nodes, spec.conv_dim, kind=dtype),
            d=buf(spec.n_v, nodes, spec.dv),
            gsum=buf(spec.n_v, nodes),
        )

    def gdn_chain(
        self, proj: Tensor, spec: GdnSpec, conv_state: Tensor, state: Tensor, group: int | None = None
    ) -> Tensor | QuantizedRows:
        """A committed chain: one token through the fused step, more through fla's chunked kernel."""
        t = proj.shape[0]
        q, k, v, g, beta = _spec_inputs(proj, spec, conv_state, update_conv=t == 1)
        if t == 1:
            return _step((q, k, v, g, beta), state, proj, spec, group)
        advance_conv(conv_state, proj, spec)  # gdn_inputs above read the old rows
        o, final = chunk_gated_delta_rule(
            q[None],
            k[None],
            v[None],
            g[None],
            beta[None],
            scale=1.0,
            initial_state=state[None],
            output_final_state=True,
        )
        state.copy_(final[0])
        return _gated_norm(o[0], proj, spec, group)

    @staticmethod
    def gdn_steps(
        proj: Tensor,
        spec: GdnSpec,
        conv_states: Tensor,
        states: Tensor,
        slots: Tensor,
        group: int | None = None,
    ) -> Tensor | QuantizedRows:
        """One token of each of P sequences in its own cache slot (slots [P] on the device): the
        fused step over every sequence, two launches whatever P."""
        inputs = _spec_inputs(proj, spec, conv_states, update_conv=True, slots=slots)
        return _step(inputs, states, proj, spec, group, slots)

    def gdn_tree(
        self,
        proj: Tensor,
        spec: GdnSpec,
        conv_state: Tensor,
        state: Tensor,
        plan: TreePlan,
        staging: GdnStaging,
        slot: int,
        group: int | None = None,
    ) -> Tensor | QuantizedRows:
        """A tree through a DeltaNet layer along each node's root path; stages k, x, d and G."""
        q, k, v, g, beta = _spec_inputs(
            proj,
            spec,
            conv_state,
            windows=plan.windows,
            k_out=staging.k[slot],
            x_out=staging.x[slot],
        )
        o, _, _ = gdn_tree(q, k, v, g, beta, state, plan, d_out=staging.d[slot], gsum_out=staging.gsum[slot])
        return _gated_norm(o, proj, spec, group)

    @staticmethod
    def gdn_forest_plan(plans: Sequence[TreePlan]) -> ForestPlan:
        """The plans of a pass's verify trees of one size, stacked once for every layer."""
        return ForestPlan.of(plans)

    @staticmethod
    def gdn_forest(
        proj: Tensor,
        spec: GdnSpec,
        conv_states: Tensor,
        states: Tensor,
        slots: Tensor,
        plan: ForestPlan,
        stagings: GdnStagings,
        layer: int,
        group: int | None = None,
    ) -> Tensor | QuantizedRows:
        """P trees of one size, each in its own cache slot, through a DeltaNet layer (as `gdn_tree`
        for each): three launches and the norm whatever P; each stages into its slot's staging."""
        parts, n = plan.parts, plan.num_nodes
        q, k, v, g, beta = _spec_inputs(
            proj,
            spec,
            conv_states,
            windows=plan.windows,
            k_out=stagings.k[:, layer],
            x_out=stagings.x[:, layer],
            slots=slots,
        )
        q, k, v, g, beta = (x.view(parts, n, *x.shape[1:]) for x in (q, k, v, g, beta))
        o = gdn_forest(q, k, v, g, beta, states, slots, plan, stagings.d[:, layer], stagings.gsum[:, layer])
        return _gated_norm(o.view(parts * n, *o.shape[2:]), proj, spec, group)

    def gdn_commit(
        self,
        conv_states: Tensor,
        states: Tensor,
        staging: GdnStaging,
        plan: TreePlan,
        path: Tensor,
        path_len: Tensor,
    ) -> None:
        """Every DeltaNet layer's states along the accepted path: two launches for the model."""
        gdn_commit(
            states, conv_states, staging.k, staging.d, staging.gsum, staging.x, plan.windows, path, path_len
        )

    @staticmethod
    def gdn_commit_forest(
        conv_states: Tensor,
        states: Tensor,
        stagings: GdnStagings,
        plans: Sequence[TreePlan],
        slots: Tensor,
        paths: Tensor,
        path_lens: Tensor,
    ) -> None:
        """P sequences' DeltaNet states along their paths [P, N], each in its slot of every slot's
        states and staging, along its own tree's conv windows: two launches (and the windows' stack)
        whatever P."""
        windows = torch.stack([plan.windows for plan in plans])  # [P, N, K]
        k, d, gsum, x = stagings.k, stagings.d, stagings.gsum, stagings.x
        gdn_commit(states, conv_states, k, d, gsum, x, windows, paths, path_lens, slots=slots)
