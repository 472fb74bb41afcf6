"""What the engine, the graphs, the loader and training need of a target model: one interface for
every model kind (dense Qwen3, hybrid Qwen3.5/3.6), so that a new family adds a module, not branches.

A verify pass needs to know its tree beyond the tokens: attention needs the ancestor relation, a
hybrid's Gated DeltaNet layers need the tree's ancestor structure and conv windows too. The target
builds all of it once per round (`Target.plan`), and every layer of the pass reads it.

Caches come in `slots` (one sequence each: its K/V rows and, for a hybrid, its recurrent and conv
states); `forward` runs slot 0, `forward_parts` runs several sequences' rows in one pass (continuous
batching, `ddtree_runtime/batching.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
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


@dataclass(frozen=True)
class Part:
    """One sequence's rows in a batched pass: its cache slot, its tokens at `input_pos`, written to
    cache rows `context_len ..`, verified as `tree` (None: a committed chain, i.e. prefill or `ar`)."""

    slot: int
    tokens: Tensor
    input_pos: Tensor
    context_len: int | Tensor
    tree: TreeInputs | None = None
    key_bound: int | None = None  # as for `Target.__call__`: None is the exact count

    @property
    def rows(self) -> int:
        return self.tokens.shape[0]

    def resolved(self) -> Part:
        """The part with what the kernels read: a device context length and a static key bound."""
        bound = self.key_bound if self.key_bound is not None else int(self.context_len) + self.rows
        return replace(
            self, context_len=as_device_length(self.context_len, self.tokens.device), key_bound=bound
        )


@dataclass(frozen=True)
class Forest:
    """N new rows of each of P sequences described by device tensors alone (no host value), so that
    a CUDA graph can capture the pass: a verify tree of N nodes each (`trees`, from `Target.plan`),
    or, without trees, N consecutive rows each (a batched `ar` step, N = 1, or the drafter's blocks).
    Sequence i's rows go to cache rows `context_lens[i] + 0 .. N - 1` of its slot, at positions
    `context_lens[i] + depth[i]`, and read at most `keys` keys."""

    tokens: Tensor  # [P, N]
    depth: Tensor  # [P, N]
    slots: Tensor  # [P]
    context_lens: Tensor  # [P]
    keys: int
    trees: Sequence[TreeInputs] = ()

    @property
    def shape(self) -> tuple[int, int]:
        """(P, N): sequences, rows each."""
        return self.tokens.shape[0], self.tokens.shape[1]


@dataclass(frozen=True)
class Steps:
    """Each of P sequences' next token, cache slot and context length in one device buffer, refilled
    before each replay of a graph that reads them (a batched round of P sequences under the key
    bound `keys`)."""

    values: Tensor  # int64 [3, P]: tokens, cache slots, context lengths (cache rows, positions)
    keys: int  # static bound on any sequence's keys (its context and its new rows)

    @classmethod
    def empty(cls, sequences: int, keys: int, device: torch.device) -> Steps:
        return cls(torch.zeros(3, sequences, dtype=torch.int64, device=device), keys)

    def fill(self, tokens: Sequence[int], slots: Sequence[int], context_lens: Sequence[int]) -> None:
        """A round's values into the buffer, in one host-to-device copy."""
        self.values.copy_(torch.tensor([list(tokens), list(slots), list(context_lens)], dtype=torch.int64))

    @property
    def tokens(self) -> Tensor:
        return self.values[0]

    @property
    def slots(self) -> Tensor:
        return self.values[1]

    @property
    def context_lens(self) -> Tensor:
        return self.values[2]

    @property
    def sequences(self) -> int:
        return self.values.shape[1]

    def forest(self) -> Forest:
        """The batched `ar` step: each sequence's token as one committed row."""
        zero = torch.zeros(self.sequences, 1, dtype=torch.int64, device=self.values.device)
        return Forest(self.tokens[:, None], zero, self.slots, self.context_lens, self.keys)


def as_device_length(context_len: int | Tensor, device: torch.device) -> Tensor:
    """A context length as the 0-d int64 device tensor the kernels read."""
    if isinstance(context_len, Tensor):
        return context_len
    return torch.full((), context_len, dtype=torch.int64, device=device)


def per_part(x: Tensor, parts: Sequence[Part], fn: Callable[[Part, Tensor], Tensor], dim: int = 0) -> Tensor:
    """`fn(part, its rows of x)` for every part, joined along `dim`: the step of a batched pass that
    reads per-sequence state (attention over its cache, its DeltaNet states), between the linear
    layers that run over every part's rows at once."""
    if len(parts) == 1:
        return fn(parts[0], x)
    chunks = x.split([p.rows for p in parts])
    return torch.cat([fn(p, rows) for p, rows in zip(parts, chunks, strict=True)], dim=dim)


@dataclass(frozen=True)
class SlotRows:
    """Several parts' rows laid out for one padded attention call per layer, on a backend with
    `attention_parts` (built once per pass; every layer reads it): the per-part launches, not the
    arithmetic, are what a batched round of a small model pays for on the CPU, and eager launches
    are what it pays for on the GPU."""

    slots: Tensor | slice  # each part's cache slot: [P], or a slice when they are consecutive (a view)
    row_slots: Tensor  # [T] each row's cache slot
    cache_rows: Tensor  # [T] each row's cache row
    positions: Tensor  # [T] each row's RoPE position
    pad: Tensor  # [P, N] each padded row's index into the T rows (T: a padding row)
    unpad: Tensor  # [T] each row's index into the P * N padded rows
    rows: list[int]
    context_lens: list[int] | Tensor  # a Tensor [P] on the device for a `Forest`
    keys: int  # the most keys any part reads (its key bound)
    visibilities: list[Any]  # each part's tree visibility (None: a chain)

    @classmethod
    def of(cls, parts: Sequence[Part]) -> SlotRows:
        device = parts[0].tokens.device
        rows = [p.rows for p in parts]
        ctxs = [int(p.context_len) for p in parts]
        n = max(rows)
        starts = torch.tensor([0, *rows], device=device).cumsum(0)[:-1]  # [P] first row of each part
        offsets = torch.arange(n, device=device)
        rows_t = torch.tensor(rows, device=device)
        valid = offsets[None, :] < rows_t[:, None]  # [P, N]
        pad = torch.where(valid, starts[:, None] + offsets[None, :], sum(rows))
        ids = [p.slot for p in parts]
        slots = torch.tensor(ids, device=device)
        consecutive = ids == list(range(ids[0], ids[0] + len(ids)))
        return cls(
            slots=slice(ids[0], ids[0] + len(ids)) if consecutive else slots,
            row_slots=slots.repeat_interleave(rows_t),
            cache_rows=torch.cat(
                [c + torch.arange(r, device=device) for c, r in zip(ctxs, rows, strict=True)]
            ),
            positions=torch.cat([p.input_pos for p in parts]),
            pad=pad,
            unpad=valid.reshape(-1).nonzero().squeeze(1),
            rows=rows,
            context_lens=ctxs,
            keys=max(
                c + r if p.key_bound is None else p.key_bound
                for c, r, p in zip(ctxs, rows, parts, strict=True)
            ),
            visibilities=[p.tree.visibility if p.tree is not None else None for p in parts],
        )

    @classmethod
    def of_forest(cls, forest: Forest) -> SlotRows:
        """A forest's layout, from its device tensors alone (a graph can capture it)."""
        p, n = forest.shape
        device = forest.tokens.device
        ids = torch.arange(p * n, device=device)
        return cls(
            slots=forest.slots,
            row_slots=forest.slots[:, None].expand(p, n).reshape(-1),
            cache_rows=(forest.context_lens[:, None] + torch.arange(n, device=device)).reshape(-1),
            positions=(forest.context_lens[:, None] + forest.depth).reshape(-1),
            pad=ids.view(p, n),
            unpad=ids,
            rows=[n] * p,
            context_lens=forest.context_lens,
            keys=forest.keys,
            visibilities=[t.visibility for t in forest.trees] or [None] * p,
        )

    def mask(
        self, backend: Backend[Any, Any, Any], all_visible: bool = False, window: int | None = None
    ) -> Any:
        """What every part's rows see, in the backend's own description (`parts_mask`): its tree,
        or a causal chain; every new row with `all_visible`, within `window` positions when set."""
        return backend.parts_mask(
            self.rows,
            self.context_lens,
            self.keys,
            self.visibilities,
            all_visible,
            window,
            self.positions.device,
        )


def slot_rows(parts: Sequence[Part], backend: Backend[Any, Any, Any]) -> SlotRows | None:
    """Several parts laid out for one attention call per layer, on a backend with `attention_parts`;
    None (attention per part) for one part or another backend."""
    return SlotRows.of(parts) if len(parts) > 1 and hasattr(backend, "attention_parts") else None


def write_slots(batch: SlotRows, k_new: Tensor, v_new: Tensor, k_caches: Tensor, v_caches: Tensor) -> None:
    """Several parts' new K/V rows [Hkv, T, D] into their slots' rows of one layer's caches
    [S, Hkv, S_max, D], in one scatter each."""
    k_caches[batch.row_slots, :, batch.cache_rows] = k_new.transpose(0, 1)
    v_caches[batch.row_slots, :, batch.cache_rows] = v_new.transpose(0, 1)


def attend_slots(
    q: Tensor, batch: SlotRows, mask: Any, k_caches: Tensor, v_caches: Tensor, backend: Backend[Any, Any, Any]
) -> Tensor:
    """Every part's attention in one `backend.attention_parts` call: q [Hq, T, D], its rows padded
    per part and back -> [Hq, T, D]."""
    hq, _, d = q.shape
    padded = torch.cat([q, q.new_zeros(hq, 1, d)], dim=1)[:, batch.pad].transpose(0, 1)  # [P, Hq, N, D]
    out = backend.attention_parts(padded, k_caches, v_caches, batch.slots, mask, d**-0.5)
    return out.transpose(0, 1).reshape(hq, -1, d)[:, batch.unpad]


class Target(Protocol):
    """A target model with static caches, verified trees and hidden-state capture."""

    config: Any
    embed_tokens: nn.Embedding
    lm_head: nn.Linear
    capture_layers: tuple[int, ...]
    graphable: bool  # its rounds may be captured as CUDA graphs (static shapes, no host sync)

    @property
    def max_context(self) -> int: ...

    def setup_caches(
        self, max_context: int, capture_layers: tuple[int, ...] = (), slots: int = 1
    ) -> None: ...

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

    def forward_parts(
        self,
        parts: Sequence[Part] | Forest,
        backend: Backend[Any, Any, Any],
        capture: bool = True,
        *,
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
        slot: int = 0,
    ) -> None: ...

    def commit_forest(
        self, forest: Forest, paths: Tensor, path_lens: Tensor, backend: Backend[Any, Any, Any]
    ) -> None: ...

    def snapshot(self, slots: Sequence[int] = (0,)) -> Callable[[], None]: ...
