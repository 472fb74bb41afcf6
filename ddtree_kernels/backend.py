"""TritonBackend: the DDTree hot-path seams of ``ddtree_runtime.backend.TorchBackend``, on Triton.

Same method names, arguments and results as TorchBackend (the oracle), composed of this package's
kernels (DDTree, Ringel & Romano, arXiv 2604.12989): ``tree_visibility`` returns ancestor bitmasks
(``TreeVisibility``) instead of a dense [N, N] mask, and everything stays on the device with no
host sync. ``ddtree_runtime.backend.select_backend`` picks this class on CUDA.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ddtree_kernels.fp8_gemm import fp8_gemm, fp8_linear_reference
from ddtree_kernels.fp8_skinny import fp8_skinny
from ddtree_kernels.gdn_tree import gdn_tree
from ddtree_kernels.host import fp8_tensor_cores
from ddtree_kernels.kv_compact import compact
from ddtree_kernels.qk_rope import qk_rope
from ddtree_kernels.rms_norm import rms_norm
from ddtree_kernels.silu_mul import silu_mul
from ddtree_kernels.skinny_matmul import MAX_ROWS, SKINNY_MAX_N, skinny_matmul
from ddtree_kernels.tree_attention import TreeVisibility, tree_attention, tree_visibility
from ddtree_kernels.tree_build import build_tree, candidate_pairs
from ddtree_kernels.tree_walk import tree_walk
from ddtree_runtime.backend import TorchBackend


class TritonBackend:
    """The Triton kernels behind TorchBackend's interface; holds the per-budget candidate tables."""

    name = "triton"

    def __init__(self) -> None:
        self._pairs: dict[tuple[int, int, torch.device], tuple[Tensor, Tensor]] = {}

    def tree_visibility(self, parents: Tensor, depth: Tensor) -> TreeVisibility:
        """Ancestor-or-self bitmasks int32 [N, ceil(N / 32)], built by one launch."""
        return tree_visibility(parents, depth)

    rms_norm = staticmethod(rms_norm)

    @staticmethod
    def linear(x: Tensor, weight: Tensor) -> Tensor:
        """x @ weight.T: the skinny kernel for a few rows and a projection-sized weight, else cuBLAS."""
        if x.shape[0] <= MAX_ROWS and weight.shape[0] <= SKINNY_MAX_N and x.stride(-1) == 1:
            return skinny_matmul(x, weight)
        return F.linear(x, weight)

    @staticmethod
    def fp8_linear(x: Tensor, weight: Tensor, scale: Tensor, block: tuple[int, int]) -> Tensor:
        """An FP8 target's linear: the skinny kernel for a few rows, else the block-scaled GEMM; the
        dequantized reference on GPUs without FP8 tensor cores (sm_80)."""
        if not fp8_tensor_cores(x.device):
            return fp8_linear_reference(x, weight, scale, block)
        if x.shape[0] <= MAX_ROWS and x.stride(-1) == 1:
            return fp8_skinny(x, weight, scale, block)
        return fp8_gemm(x, weight, scale, block)

    qk_rope = staticmethod(qk_rope)
    silu_mul = staticmethod(silu_mul)

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
        """q [Hq, N, D] over the context and the visible new rows; [Hq, N, D] in q's dtype.

        A sliding window (a hybrid drafter's sliding layers) takes the PyTorch path."""
        if window is not None:
            return TorchBackend.attention(
                self, q, k_cache, v_cache, context_len, None, scale, key_bound, all_visible, window
            )
        return tree_attention(
            q, k_cache, v_cache, context_len, visibility, scale, key_bound=key_bound, all_visible=all_visible
        )

    def build_tree(
        self, draft_logits: Tensor, budget: int, root_token: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """tokens, parents, depth [budget + 1] of the top-budget prefixes (same set as the heap)."""
        key = (budget, min(budget, draft_logits.shape[1]), draft_logits.device)
        if key not in self._pairs:
            self._pairs[key] = candidate_pairs(*key)
        return build_tree(draft_logits, budget, root_token, self._pairs[key])

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

    def compact(
        self, k_cache: Tensor, v_cache: Tensor, context_len: int | Tensor, path: Tensor, path_len: Tensor
    ) -> None:
        """Accepted rows into place for every layer of [L, Hkv, S_max, D] caches, one launch."""
        compact(k_cache, v_cache, context_len, path, path_len)

    def gdn_tree(
        self, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, parents: Tensor, state: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Gated DeltaNet over a tree along each node's root path: o, d [H, N, Dv], G [H, N]."""
        return gdn_tree(q, k, v, g, beta, parents, state)
