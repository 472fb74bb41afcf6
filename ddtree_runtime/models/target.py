"""What the engine, the graphs, the loader and training need of a target model: one interface for
every model kind (dense Qwen3, hybrid Qwen3.5/3.6), so that a new family adds a module, not branches.

A verify pass needs to know its tree beyond the tokens: attention needs the ancestor relation, a
hybrid's Gated DeltaNet layers need the tree's ancestor structure and conv windows too. The target
builds all of it once per round (`Target.plan`), and every layer of the pass reads it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from ddtree_runtime.backend import Backend


@dataclass(frozen=True)
class TreeInputs:
    """One verify pass's tree, as the target's layers read it (built by `Target.plan`)."""

    chain: bool  # a chain of drafts (dflash): causal, and its K/V rows need no compaction
    visibility: Any = None  # the backend's attention visibility (None: causal)
    gdn: Any = None  # the backend's Gated DeltaNet plan (hybrid targets only)


class Target(Protocol):
    """A target model with static caches, verified trees and hidden-state capture."""

    config: Any
    embed_tokens: nn.Embedding
    lm_head: nn.Linear
    capture_layers: tuple[int, ...]
    graphable: bool  # its rounds may be captured as CUDA graphs (static shapes, no host sync)

    @property
    def max_context(self) -> int: ...

    def setup_caches(self, max_context: int, capture_layers: tuple[int, ...] = ()) -> None: ...

    def plan(
        self, parents: Tensor, depth: Tensor, backend: Backend[Any, Any, Any], chain: bool
    ) -> TreeInputs: ...

    def __call__(
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
    ) -> tuple[Tensor, Tensor | None]: ...

    def commit(
        self,
        context_len: int | Tensor,
        tree: TreeInputs,
        path: Tensor,
        path_len: Tensor,
        backend: Backend[Any, Any, Any],
    ) -> None: ...

    def snapshot(self) -> Callable[[], None]: ...
