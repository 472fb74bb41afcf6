"""One decoding round on static buffers: the code a CUDA graph captures, and the eager path too.

A round reads and writes only `RoundBuffers` (the next root token, the committed length, the
drafter's unread context features, the round's output), so its shapes never change and one
captured graph replays every round of a context bucket: lengths live on the device, and the host
reads one small tensor per round (`out`: accepted count and tokens), the one sync the stopping
rules need. Each round is a list of phases (`draft`, `tree`, `verify`, `walk`, `compact`) handing
their results on through one `RoundState` (SpecDecodeMetadata-like: a typed contract between the
phases), so that a profile can time them one by one.

Round of `ddtree` (DDTree, Ringel & Romano, arXiv 2604.12989), `dflash` (a chain) and `ar`:
    draft    the drafter ingests the rows accepted last round, drafts [root, MASK x (B - 1)]
    tree     the `budget` most probable prefixes (ddtree) or the argmax chain (dflash)
    verify   one target pass over [root] + nodes at positions ctx + depth
    walk     follow the target's own choice down the tree; the first miss is the bonus token
    compact  accepted K/V rows into place; the accepted rows' features for the next draft

A request for logprobs adds, at the end of the round, the target's log-probabilities of the
emitted tokens (each from its parent row's logits) into static buffers, so that this step could
be captured too; such rounds run eagerly today (`Engine.generate`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ddtree_runtime.backend import Backend
from ddtree_runtime.logprobs import MAX_LOGPROBS, token_logprobs
from ddtree_runtime.models.dflash import DFlashDrafter
from ddtree_runtime.models.target import Target, TreeInputs

Phase = tuple[str, Callable[[], None]]


@dataclass
class RoundBuffers:
    """Device tensors every round reads and writes in place (allocated once per engine)."""

    root: Tensor  # [1] int64: the token to verify next (last round's bonus)
    ctx: Tensor  # 0-d int64: committed target rows (= the root's position)
    feats: Tensor  # [block, n_ids * hidden]: target hidden states the drafter has not read, padded
    n_feats: Tensor  # 0-d int64: real rows of feats (they end at ctx)
    out: Tensor  # [1 + block] int64: accepted rows n (root included), then the n new tokens
    # written only when a request asks for logprobs: per new token, its log-probability under the
    # target, then the `top` most likely ones' (fp32), and those tokens' ids
    logprobs: Tensor  # [block, 1 + top] fp32
    top_ids: Tensor  # [block, top] int64

    @classmethod
    def allocate(
        cls, block: int, features: int, device: torch.device, dtype: torch.dtype, top: int = MAX_LOGPROBS
    ) -> RoundBuffers:
        def ints(*shape: int) -> Tensor:
            return torch.zeros(shape, dtype=torch.int64, device=device)

        return cls(
            ints(1),
            ints(),
            torch.zeros(block, features, device=device, dtype=dtype),
            ints(),
            ints(1 + block),
            torch.zeros(block, 1 + top, device=device, dtype=torch.float32),
            ints(block, top),
        )

    def advance(self, path: Tensor, path_len: Tensor, tokens: Tensor, hidden: Tensor, bonus: Tensor) -> None:
        """After a verify pass: the accepted rows' features for the next draft, the round's output
        (the accepted nodes after the root, then the bonus), the new length and root."""
        block = self.feats.shape[0]
        m = min(path.shape[0], block)  # a tree of budget + 1 < block nodes is at most that deep
        keep = path[:m].clamp(min=0)
        self.feats[:m].copy_(hidden[keep])
        self.n_feats.copy_(path_len)
        on_path = tokens[keep]
        shifted = torch.cat([on_path[1:], on_path[:1]])
        self.out[0] = path_len
        self.out[1 : 1 + m] = torch.where(torch.arange(m, device=path.device) < path_len - 1, shifted, bonus)
        self.ctx.add_(path_len)
        self.root.copy_(bonus.reshape(1))

    def record_logprobs(self, logits: Tensor, rows: Tensor) -> None:
        """The round's logprobs: new token i (`out[1 + i]`) was chosen at row `rows[i]` of the
        verify pass's `logits`. Fixed shapes and no host sync (capturable); rows past the accepted
        count hold leftovers that nobody reads."""
        m = rows.shape[0]
        values, ids = token_logprobs(logits[rows], self.out[1 : 1 + m], self.top_ids.shape[1])
        self.logprobs[:m].copy_(values)
        self.top_ids[:m].copy_(ids)

    def snapshot(self) -> Callable[[], None]:
        """A function that puts the round state (root, length, features) back as it is now: a graph
        capture or a profile runs rounds that must leave no trace."""
        state = (self.root, self.ctx, self.feats, self.n_feats)
        saved = [t.clone() for t in state]

        def restore() -> None:
            for dst, src in zip(state, saved, strict=True):
                dst.copy_(src)

        return restore

    def start(self, root: Tensor, ctx: int) -> None:
        """Set up for the first round after a prefill of `ctx` rows (the drafter has read them all)."""
        self.root.copy_(root.reshape(1))
        self.ctx.fill_(ctx)
        self.n_feats.zero_()


@dataclass(frozen=True)
class Sampling:
    """T == 0 is greedy (and graph-capturable); T > 0 samples with an optional generator."""

    temperature: float = 0.0
    top_p: float = 1.0
    generator: torch.Generator | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0


def nucleus(logits: Tensor, temperature: float, top_p: float) -> Tensor:
    """logits: [..., V] with every token outside the top-p nucleus of softmax(logits / T) at -inf.

    Sampling softmax(result / T) is then sampling the nucleus distribution, so the backend's walk
    (which only knows T) stays exact for top-p too."""
    if temperature <= 0 or top_p >= 1.0:
        return logits
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    drop_sorted = sorted_probs.cumsum(dim=-1) - sorted_probs >= top_p  # the best token always stays
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.float().masked_fill(drop, float("-inf"))


def choose(logits: Tensor, sampling: Sampling) -> Tensor:
    """logits: [V] -> 0-d token: argmax at T == 0, else a sample of the nucleus of softmax(logits / T)."""
    if sampling.greedy:
        return logits.argmax(-1)
    logits = nucleus(logits, sampling.temperature, sampling.top_p)
    probs = torch.softmax(logits.float() / sampling.temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=sampling.generator)[0]


@dataclass
class RoundState:
    """What one phase of a speculative round hands the next. One instance per captured round: its
    tensors are made inside the round, so a graph replays them at the addresses it captured."""

    draft_logits: Tensor | None = None  # [block - 1, V] fp32
    tokens: Tensor | None = None  # [N]: the root, then the drafted nodes
    parents: Tensor | None = None  # [N], parents[0] = -1
    depth: Tensor | None = None  # [N]
    tree: TreeInputs | None = None  # what the target's layers need of the tree
    logits: Tensor | None = None  # [N, V]
    hidden: Tensor | None = None  # [N, features]
    path: Tensor | None = None  # [N] accepted nodes, padded with -1
    path_len: Tensor | None = None  # 0-d, the root counted
    bonus: Tensor | None = None  # 0-d


def ar_phases(
    target: Target,
    backend: Backend[Any, Any, Any],
    buf: RoundBuffers,
    key_bound: int,
    sampling: Sampling,
    logprobs: bool = False,
) -> list[Phase]:
    """Plain decoding: one target pass for one token."""
    first_row = torch.zeros(1, dtype=torch.int64, device=buf.root.device)

    def verify() -> None:
        logits, _ = target(
            buf.root,
            buf.ctx.reshape(1),
            buf.ctx,
            None,
            backend,
            False,
            key_bound=key_bound,
            logits_dtype=None if sampling.greedy else torch.float32,
        )
        token = choose(logits[0], sampling)
        buf.out[:1].fill_(1)
        buf.out[1] = token
        buf.root.copy_(token.reshape(1))
        buf.ctx.add_(1)
        if logprobs:
            buf.record_logprobs(logits, first_row)

    return [("verify", verify)]


def spec_phases(
    target: Target,
    drafter: DFlashDrafter,
    head: nn.Module,
    backend: Backend[Any, Any, Any],
    buf: RoundBuffers,
    mode: str,
    budget: int,
    block: int,
    key_bound: int,
    sampling: Sampling,
    logprobs: bool = False,
) -> list[Phase]:
    """One speculative round (`dflash` or `ddtree`) of a `block`-token draft as phases over `buf`
    (whose features hold `block` rows) and one `RoundState`; the drafts' logits go through `head`
    (`engine.draft_head`: the target's LM head or its FP8 copy). With `logprobs`, `compact` also
    records the emitted tokens' logprobs: each at its parent on the accepted path (the bonus at
    the last accepted node)."""
    cfg, device = drafter.config, buf.root.device
    masks = torch.full((block - 1,), cfg.mask_token_id, dtype=torch.int64, device=device)
    chain_parents = torch.arange(block, device=device) - 1
    chain_depth = torch.arange(block, device=device)
    s = RoundState()

    def draft() -> None:
        noise = (
            target.embed_tokens(torch.cat([buf.root, masks])) * cfg.input_embedding_scale
        )  # [block, hidden]
        drafter.ingest(buf.feats, buf.ctx - buf.n_feats, backend)
        hidden = drafter.draft(noise, buf.ctx, backend, key_bound)
        s.draft_logits = drafter.logits(hidden[1:], head)  # [block - 1, V]

    def tree() -> None:
        if mode == "ddtree":
            s.tokens, s.parents, s.depth = backend.build_tree(s.draft_logits, budget, buf.root[0])
        else:
            s.tokens = torch.cat([buf.root, s.draft_logits.argmax(-1)])
            s.parents, s.depth = chain_parents, chain_depth
        s.tree = target.plan(s.parents, s.depth, backend, chain=mode != "ddtree")

    def verify() -> None:
        s.logits, s.hidden = target(
            s.tokens,
            buf.ctx + s.depth,
            buf.ctx,
            s.tree,
            backend,
            key_bound=key_bound,
            logits_dtype=None if sampling.greedy else torch.float32,
        )

    def walk() -> None:
        logits = nucleus(s.logits, sampling.temperature, sampling.top_p)
        s.path, s.path_len, s.bonus = backend.tree_walk(
            s.tokens, s.parents, logits, sampling.temperature, sampling.generator
        )

    def compact() -> None:
        target.commit(buf.ctx, s.tree, s.path, s.path_len, backend)
        buf.advance(s.path, s.path_len, s.tokens, s.hidden, s.bonus)
        if logprobs:
            buf.record_logprobs(s.logits, s.path[: buf.feats.shape[0]].clamp(min=0))

    return [("draft", draft), ("tree", tree), ("verify", verify), ("walk", walk), ("compact", compact)]
