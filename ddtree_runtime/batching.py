"""Continuous batching: up to `max_batch` sequences decode together, one speculative round for all.

Each sequence owns a cache slot (its K/V rows in the target and the drafter and, for a hybrid
target, its recurrent and conv states). A request joins once its prompt is prefilled and leaves at
a round boundary; prompts are prefilled at most `prefill_chunk` tokens a step between rounds (a
long one in chunks; several short ones together), so the running sequences keep streaming. One
`step` is one prefill pass, then one round of every decoding sequence:

    draft    every speculative slot's block [root, MASK x (B - 1)] in one drafter pass (with a
             budget policy, only the ddtree slots it keeps on speculation; none: no pass)
    tree     each slot its own: the `budget` best prefixes (ddtree), the argmax chain (dflash), or
             the root alone (`ar`, or a ddtree slot off speculation: a one-node tree)
    verify   every slot's nodes in ONE target pass (`Target.forward_parts`): the linear layers run
             over the concatenated rows of all slots (one read of the weights, where batching
             pays); a dense model's attention is one padded call per layer over all slots
             (`attention_parts`: an SDPA on the CPU, one Triton launch on CUDA), each slot over
             its own cache, context length and tree, a hybrid's gated attention too; a hybrid's
             DeltaNet layers step every `ar` slot in one call (`gdn_steps`) and verify the
             trees and chains of each node count shared by several slots in one call
             (`gdn_forest`: at a fixed budget, every ddtree slot's), any other on its own
    walk     per slot, the target's own choice down its tree (as `rounds.py`); the greedy slots in
             one call (`tree_walk_parts`)
    commit   accepted K/V rows and DeltaNet states into place: in a tree round every slot's in one
             call each (`Target.commit_forest`), and the accepted rows' features into the
             drafter's cache (its next round would read them); else per slot, the features at
             the slot's next draft

Every slot does what `Engine.generate` does for it alone, so each request gets its own tokens
(T = 0) whatever else is in the batch. Two kinds of round are described by device tensors alone
(`Forest`: each sequence's rows, slot and length, no host value), so that on CUDA a graph captures
them at their first use and replays them with their buffers (`Steps`) refilled (a launch per
kernel cost a 27B round ~4x its GPU work):
    - a round where every sequence verifies its root alone (`ar` requests, and ddtree ones a
      budget policy took off speculation, whose rows' features it also returns for the drafter):
      the target's step of P sequences (one graph per (P, key bound), each kind);
    - a tree round: every sequence a greedy ddtree one of one budget (the served default), or with
      a budget policy between probes its best one budget for all: draft, every tree and its plan,
      the verify pass over the forest, every walk, every commit and the drafter's ingest (one
      graph per (P, budget, key bound)); after it the host reads every slot's outcome (accepted count, bonus and tokens) in
      one transfer. Elsewhere its phases run as they are.
Other rounds (mixed modes or budgets, sampling, the policy's probes) run eagerly, with host-side
lengths; `Engine.generate` (slot 0, graphed on CUDA) stays the batch-1 path. With graphs the
graphed rounds are padded to batch buckets (powers of two, then `max_batch`): the padding sequences
write a scratch cache slot that no request owns, so that `warmup` captures every shape serving can
hit (batch bucket x context bucket x budget) before the server reports healthy.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from ddtree_runtime.backend import Backend, select_backend
from ddtree_runtime.budgets import BudgetPolicy, expected_gains, gain
from ddtree_runtime.engine import Engine, GenerationError, graphs_allowed
from ddtree_runtime.generation import GenerationResult, Output
from ddtree_runtime.graphs import RoundGraphs, buckets, key_bound
from ddtree_runtime.logprobs import TokenLogprob, as_entries, token_logprobs
from ddtree_runtime.models.dflash import DFlashDrafter
from ddtree_runtime.models.target import Forest, Part, Steps, Target, TreeInputs
from ddtree_runtime.rounds import Phase, Sampling, choose, nucleus
from specops_contract import SERVE_OPTIONS, verify_rows

Walk = tuple[Tensor, Tensor, Tensor]  # a tree walk: path, path_len, bonus (`Backend.tree_walk`)
StepKey = tuple[str, int, int, int]  # a batched round's graph: (kind, sequences, budget, key bound)


@dataclass
class Live:
    """One sequence in a slot: its request, where its prefill and decoding stand, its output."""

    slot: int
    prompt: list[int]
    mode: str
    budget: int  # ddtree: nodes per round (with a budget policy: the most)
    sampling: Sampling
    out: Output
    added: float = field(default_factory=time.perf_counter)
    prefilled: int = 0  # prompt rows in the caches
    prefill_s: float = 0.0
    root: int = 0  # the token to verify next (valid once prefilled)
    ctx: int = 0  # committed rows (= the root's position)
    feats: Tensor | None = None  # target hidden states of accepted rows the drafter has not read
    gains: list[float] | None = None  # with a budget policy: its last draft's expected tokens by budget
    accepted: list[int] = field(default_factory=list)
    budgets: list[int] = field(default_factory=list)  # ddtree: each round's budget
    logprobs: int | None = None  # asked: each emitted token's logprob and this many top ones
    result: GenerationResult | None = None

    @property
    def decoding(self) -> bool:
        return self.prefilled == len(self.prompt)


@dataclass
class _Tree:
    """One slot's nodes in a round."""

    live: Live
    tokens: Tensor
    parents: Tensor
    depth: Tensor
    draft_logits: Tensor | None  # None: not drafted
    tree: TreeInputs | None = None  # None: `ar`, a committed one-token chain


@dataclass
class _TreeRound:
    """A round of P greedy ddtree sequences of one budget from device tensors alone (`steps`: their
    roots, slots and lengths): every drafter block in one pass, each sequence's tree and plan, one
    verify pass over the forest, every walk in one call, every commit in one call each, and the
    accepted rows' features into the drafter's cache. A CUDA graph captures its phases (one per (P,
    budget, key bound)); elsewhere they run as they are. It keeps only what the host reads after it
    (`outcome`), valid until the next round: a graph's outputs stay allocated as long as the graph,
    and the logits ([P N, V], and the drafter's) would hold GBs per round shape of a large
    vocabulary."""

    steps: Steps
    phases: list[Phase] = field(default_factory=list)
    # [P, 1 + M] (M = min(N, block), the longest a path can be): each sequence's accepted rows n
    # (its root counted), its bonus token, then its n - 1 accepted drafts (the rest undefined)
    outcome: Tensor | None = None


class BatchEngine(Engine):
    """An `Engine` whose caches hold `max_batch` sequences, and the steps that decode them together.

    `add` puts a request in a free slot; each `step` prefills one chunk and runs one round; a
    finished sequence's `result` is set and its slot freed. Not thread-safe: one thread drives it
    (the server's worker)."""

    def __init__(
        self,
        target: Target,
        drafter: DFlashDrafter | None,
        max_context: int,
        max_batch: int,
        backend: Backend[Any, Any, Any] | None = None,
        prefill_chunk: int | None = None,
        policy: BudgetPolicy | None = None,
        graphs: bool | None = None,
        padded: bool | None = None,
        fp8_draft_head: bool | None = None,
    ) -> None:
        if max_batch < 1:
            raise GenerationError(f"max_batch is {max_batch} (fix: at least 1)")
        if prefill_chunk is not None and prefill_chunk < 1:
            raise GenerationError(f"prefill_chunk is {prefill_chunk} (fix: at least 1, or none)")
        backend = backend or select_backend(target.embed_tokens.weight.device)
        if graphs is None:
            graphs = graphs_allowed(target, backend)
        self.padded = graphs if padded is None else padded
        # padded: one more slot, the scratch slot that padding sequences write (and nobody reads)
        super().__init__(
            target,
            drafter,
            max_context,
            backend,
            graphs=False,
            slots=max_batch + (1 if self.padded else 0),
            fp8_draft_head=fp8_draft_head,
        )
        self.max_batch = max_batch
        self.scratch = max_batch  # the padding sequences' slot (with `padded`)
        self.prefill_chunk = prefill_chunk or max_context
        self.policy = policy  # None: every ddtree request verifies its own budget each round
        self.free = list(range(max_batch))  # `add` takes the lowest
        self.live: list[Live] = []
        self.chunks = 0  # prefill chunks run so far
        self.rounds = 0  # batched rounds run so far
        self.drafts = 0  # drafter passes run so far (a round with no slot drafting runs none)
        self.latest: list[float] | None = None  # with a policy: the last expected-token curve of any slot
        self.probe_gap = 0  # with a policy: rounds from the last probe to the next
        self.probe_at = 0  # the round of the next probe (every ddtree slot drafts)
        self.step_graphs = RoundGraphs(self.device) if graphs else None  # by `StepKey`
        self.step_buffers: dict[StepKey, tuple[Steps, list[Tensor | None]]] = {}  # each step graph's in, out
        self.tree_rounds: dict[StepKey, _TreeRound] = {}  # graphed on CUDA

    def batch_buckets(self) -> list[int]:
        """The sequence counts a graphed round runs at: powers of two, then `max_batch`."""
        out, n = [], 1
        while n < self.max_batch:
            out.append(n)
            n *= 2
        return [*out, self.max_batch]

    def _sequences(self, live: int) -> int:
        """The sequences a round of `live` runs (padded: its batch bucket, the rest scratch)."""
        return min(n for n in self.batch_buckets() if n >= live) if self.padded else live

    def _values(self, batch: list[Live]) -> tuple[int, tuple[list[int], list[int], list[int]]]:
        """A round's sequence count and its `Steps` values (roots, slots, lengths), padded with
        sequences of token 0 at the start of the scratch slot."""
        n = self._sequences(len(batch))
        pad = n - len(batch)
        return n, (
            [s.root for s in batch] + [0] * pad,
            [s.slot for s in batch] + [self.scratch] * pad,
            [s.ctx for s in batch] + [0] * pad,
        )

    @torch.inference_mode()
    def warmup(self, modes: Sequence[str], budgets: Sequence[int], max_prompt: int | None = None) -> None:
        """`Engine.warmup` (every mode's kernels and the prefill's), then, padded, every batched
        round shape serving can hit, so that no request pays a capture: per batch bucket and
        context bucket, the `ar` step (graphs only; with a budget policy also the step of roots with
        their features, every slot off speculation) and the tree round of every budget a round can
        verify (with a budget policy, its budgets too), on CUDA captured on the scratch slot alone."""
        super().warmup(modes, budgets, max_prompt)
        if not self.padded:
            return
        levels = sorted(set(budgets) | set(self.policy.budgets if self.policy is not None else ()))
        for n in self.batch_buckets():
            values = [0] * n, [self.scratch] * n, [0] * n
            for bound in buckets(self.max_context):
                if "ar" in modes and self.step_graphs is not None:
                    self._step_graph(("ar", n, 0, bound), values)
                if self.policy is not None and self.step_graphs is not None:  # every slot off speculation
                    self._step_graph(("roots", n, 0, bound), values)
                for budget in levels if "ddtree" in modes and self.drafter is not None else ():
                    if verify_rows("ddtree", self.block, budget) < bound:
                        self._tree_graph(("ddtree", n, budget, bound), values)

    @property
    def block(self) -> int:
        return self.drafter.config.block_size if self.drafter is not None else 2

    def add(
        self,
        prompt_ids: Sequence[int],
        *,
        mode: str = "ddtree",
        budget: int = SERVE_OPTIONS["budget"].default,
        max_new_tokens: int = 128,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int | None = None,
        eos_ids: Sequence[int] | None = None,
        stop: Sequence[str] = (),
        decode: Callable[[list[int]], str] | None = None,
        on_tokens: Callable[[list[int]], None] | None = None,
        cancel: threading.Event | None = None,
        logprobs: int | None = None,
        on_logprobs: Callable[[list[TokenLogprob]], None] | None = None,
    ) -> Live:
        """Take a free slot for a request (arguments as `Engine.generate`; with a budget policy, a
        ddtree `budget` is the most its rounds verify). Its prefill starts at the next `step`. A
        request for `logprobs` runs its rounds eagerly (they keep the verify pass's logits)."""
        if not self.free:
            raise GenerationError(f"all {self.max_batch} slots are in use (fix: wait for a step to free one)")
        self._check(mode, prompt_ids, max_new_tokens, budget, self.block)
        top = self.buffers.top_ids.shape[1]
        if logprobs is not None and not 0 <= logprobs <= top:
            raise GenerationError(f"logprobs {logprobs} is outside [0, {top}] (fix: ask for at most {top})")
        eos = set(self.target.config.eos_token_ids if eos_ids is None else eos_ids)
        live = Live(
            self.free.pop(self.free.index(min(self.free))),  # the lowest: slots in use stay 0 .. P-1
            list(prompt_ids),
            mode,
            budget if mode == "ddtree" else 0,
            self._sampling(temperature, top_p, seed),
            Output(max_new_tokens, eos, stop, decode, on_tokens, cancel, on_logprobs),
            logprobs=logprobs,
        )
        self.live.append(live)
        return live

    @torch.inference_mode()
    def step(self) -> list[Live]:
        """One prefill pass (`_prefill_pass`), then one round of every decoding sequence; returns those
        that finished."""
        finished = [s for s in self.live if s.out.cancelled()]
        prefilling = [s for s in self.live if not s.decoding and s not in finished]
        if prefilling:
            finished += self._prefill_pass(prefilling)
        # in slot order, lowest first: with the slots 0 .. P-1 in use the caches read as a view
        decoding = sorted((s for s in self.live if s.decoding and s not in finished), key=lambda s: s.slot)
        if decoding:
            finished += self._round(decoding)
        for s in finished:
            self._finish(s)
        return finished

    def run(self, requests: Sequence[dict[str, Any]]) -> list[GenerationResult]:
        """Generate for every request (`add`'s keyword arguments), `max_batch` at a time, in order of
        arrival; the results in the requests' order (a convenience for benchmarks and tests)."""
        pending, started = list(enumerate(requests)), {}
        while pending or self.live:
            while pending and self.free:
                i, kwargs = pending.pop(0)
                started[i] = self.add(**kwargs)
            self.step()
        results = []
        for i in range(len(requests)):
            result = started[i].result
            assert result is not None, "run() ends once every request has finished"
            results.append(result)
        return results

    def abort(self) -> list[Live]:
        """Drop every live sequence (after a failed step: their caches are in no known state) and
        free their slots; returns them."""
        dropped, self.live = self.live, []
        self.free.extend(s.slot for s in dropped)
        return dropped

    def _prefill_pass(self, prefilling: list[Live]) -> list[Live]:
        """One pass over the next prompt chunks, up to `prefill_chunk` tokens in all, the prompts
        nearest their end first (a short prompt is never stuck behind a long one): the linears run
        over all of them at once, as a round's do, instead of a pass per prompt. Features go to the
        drafter; a prompt that ends gets its first token. Returns the sequences that token ends."""
        t0 = time.perf_counter()
        chunks, room = [], self.prefill_chunk
        for s in sorted(prefilling, key=lambda s: len(s.prompt) - s.prefilled):
            if room == 0:
                break
            hi = min(len(s.prompt), s.prefilled + room)
            chunks.append((s, s.prefilled, hi))
            room -= hi - s.prefilled
        parts = []
        for s, lo, hi in chunks:
            tokens = torch.tensor(s.prompt[lo:hi], dtype=torch.int64, device=self.device)
            parts.append(Part(s.slot, tokens, torch.arange(lo, hi, device=self.device), lo))
        spec = [s.mode != "ar" for s, _, _ in chunks]
        normed, hidden = self.target.forward_parts(parts, self.backend, capture=any(spec), final_hidden=True)
        if any(spec):
            assert self.drafter is not None and hidden is not None
            rows = hidden.split([p.rows for p in parts])
            self.drafter.ingest_parts(
                torch.cat([r for r, keep in zip(rows, spec, strict=True) if keep]),
                [p for p, keep in zip(parts, spec, strict=True) if keep],
                self.backend,
            )
        self.chunks += 1
        finished, last = [], -1
        for s, lo, hi in chunks:
            last += hi - lo
            s.prefilled = hi
            if s.decoding:  # its prompt is in: its first token, from its last row (as alone)
                logits = self.target.lm_head(normed[last : last + 1]).float()
                s.root, s.ctx = int(choose(logits[-1], s.sampling)), hi
                if s.out.emit([s.root], self._entries(s, logits, [s.root])):
                    finished.append(s)
        share = (time.perf_counter() - t0) / len(chunks)
        for s, _, _ in chunks:
            s.prefill_s += share
        return finished

    def _round(self, batch: list[Live]) -> list[Live]:
        """One round of every sequence in `batch` (all prefilled); returns those it finished. With a
        budget policy, its wall time (streaming its tokens included) goes to the policy against
        the table's cost of its rows (`BudgetPolicy.observe`), and so do its trees' tokens against
        their curves (`_credit`)."""
        self.rounds += 1
        start, probe = time.perf_counter(), self._probing()
        budget = self._shared_budget(batch)
        if budget is not None:
            finished = self._tree_round(batch, budget)
            padded, drafting = len(batch) * (budget + 1), len(batch)
        else:
            trees, logits, hidden = self._mixed_round(batch)
            sizes = [t.tokens.shape[0] for t in trees]
            rows = logits.split(sizes)
            walks = self._greedy_walks(trees, rows)
            finished = []
            hiddens = hidden.split(sizes) if hidden is not None else [None] * len(trees)
            for t, r, h in zip(trees, rows, hiddens, strict=True):
                if t.live.out.emit(*self._walk(t, r, h, walks.get(id(t)))):
                    finished.append(t.live)
            padded, drafting = len(trees) * max(sizes), sum(t.draft_logits is not None for t in trees)
        if self.policy is not None:
            if not probe:  # a probe's eager round is the policy's own cost
                self.policy.observe(len(batch), padded, drafting, time.perf_counter() - start)
            self._credit(batch, self.policy)
        return finished

    def _credit(self, batch: list[Live], policy: BudgetPolicy) -> None:
        """Every ddtree slot that verified a tree this round: the tokens it gave against those its
        curve expected (the one its budget was picked by: this round's draft, or between probes its
        last), for the policy's calibration (`BudgetPolicy.credit`)."""
        for s in batch:
            curve = s.gains or self.latest
            if s.mode == "ddtree" and s.budgets[-1] > 0 and curve is not None:
                policy.credit(gain(curve, s.budgets[-1]), s.accepted[-1] + 1)

    def _mixed_round(self, batch: list[Live]) -> tuple[list[_Tree], Tensor, Tensor | None]:
        """A round of any mix of modes, budgets and samplings (the budget policy's too): each slot's
        tree built on the host's description of it, the verify pass over host-side lengths (a
        round of `ar` sequences only: a replayed step on CUDA). Its trees, logits and features."""
        policy = self.policy
        probe = self._probing()
        spec = [s for s in batch if s.mode != "ar"]
        if policy is not None and not probe:
            spec = self._speculating(spec, batch, policy)
        drafts = {}
        if spec:
            self.drafts += 1
            drafts = dict(zip((id(s) for s in spec), self._draft(spec), strict=True))
        trees = [self._tree(s, drafts.get(id(s))) for s in batch]
        if policy is not None:
            speculating = self._follow_load(trees, policy)
            if probe:
                self.probe_gap = policy.next_gap(self.probe_gap, speculating)
                self.probe_at = self.rounds + self.probe_gap
        for t in trees:
            if t.live.mode == "ddtree":
                t.live.budgets.append(t.tokens.shape[0] - 1)
            if t.tokens.shape[0] > 1:  # one node: the root alone, an `ar` row
                t.tree = self.target.plan(t.parents, t.depth, self.backend, t.live.mode != "ddtree")
        if self.step_graphs is not None and all(t.tree is None and t.live.logprobs is None for t in trees):
            # every slot verifies its root alone: `ar` requests, and ddtree ones off speculation,
            # whose rows' features the step also returns for the drafter
            logits, hidden = self._replay_steps(batch, features=any(s.mode != "ar" for s in batch))
        else:
            greedy = all(s.sampling.greedy for s in batch)
            parts = [
                Part(
                    t.live.slot,
                    t.tokens,
                    t.live.ctx + t.depth,
                    t.live.ctx,
                    t.tree,
                    self._bound(t.live, t.tree is None),
                )
                for t in trees
            ]
            logits, hidden = self.target.forward_parts(
                parts,
                self.backend,
                capture=any(s.mode != "ar" for s in batch),  # a slot off speculation feeds its drafter too
                logits_dtype=None if greedy else torch.float32,
            )
        return trees, logits, hidden

    def _probing(self) -> bool:
        """Whether this round is a budget policy's probe: every ddtree slot drafts (module)."""
        return self.policy is not None and (self.latest is None or self.rounds >= self.probe_at)

    def _shared_budget(self, batch: list[Live]) -> int | None:
        """The budget of a round that runs as a `_TreeRound` (every slot a greedy ddtree one of one
        budget): that budget, or with a policy between probes its best one budget for all from the
        slots' last curves; None for any other round (and for a policy's 0: no drafting)."""
        caps = {s.budget for s in batch}
        if len(caps) != 1 or any(
            s.mode != "ddtree" or not s.sampling.greedy or s.logprobs is not None for s in batch
        ):
            return None
        if self.policy is None:
            return caps.pop()
        if self._probing():  # the policy's own round
            return None
        return self.policy.shared([s.gains or self.latest for s in batch], caps.pop()) or None

    def _tree_round(self, batch: list[Live], budget: int) -> list[Live]:
        """The round of `batch` (greedy ddtree sequences of one `budget`) as a `_TreeRound` per
        (sequences, padded: their batch bucket; budget; key bound): on CUDA a graph captured at its
        first use and replayed (warmed: `warmup`), elsewhere its phases run as they are; every slot
        committed inside it. Then one host read of every slot's outcome; returns those it finished."""
        self.drafts += 1
        self._ingest(batch)
        n, values = self._values(batch)
        key: StepKey = ("ddtree", n, budget, max(self._bound(s) for s in batch))
        r = self._tree_graph(key, values)
        r.steps.fill(*values)
        if self.step_graphs is not None:
            self.step_graphs.replay(key)
        else:
            for _, run in r.phases:
                run()
        assert r.outcome is not None
        outcomes = r.outcome[: len(batch)].tolist()  # the round's one host read
        finished = []
        for s, (accepted, bonus, *drafts) in zip(batch, outcomes, strict=True):
            s.budgets.append(budget)
            if s.out.emit(self._advance(s, None, drafts[: accepted - 1], bonus)):
                finished.append(s)
        return finished

    def _tree_graph(self, key: StepKey, values: tuple[list[int], list[int], list[int]]) -> _TreeRound:
        """The tree round of `key`, made (and on CUDA captured, from these values) at its first use."""
        r = self.tree_rounds.get(key)
        if r is None:
            r = self.tree_rounds[key] = self._tree_phases(*key[1:])
            if self.step_graphs is not None:
                # the warm-up run before the capture commits these sequences for real: their states
                # are put back (K/V rows past their contexts the round rewrites)
                r.steps.fill(*values)
                self.step_graphs.capture(key, r.phases, self.target.snapshot(sorted(set(values[1]))))
        return r

    def _tree_phases(self, sequences: int, budget: int, bound: int) -> _TreeRound:
        """A `_TreeRound`'s buffers and phases: draft (every block in one drafter pass), tree (each
        sequence's best-`budget` tree and its plan), verify (one target pass over the forest), walk
        (every tree's in one call) and commit (every sequence's accepted rows and states into place,
        one call each, and the outcome the host reads). What passes between phases is not kept."""
        assert self.drafter is not None
        cfg, block, backend, target = self.drafter.config, self.block, self.backend, self.target
        drafter = self.drafter
        r = _TreeRound(Steps.empty(sequences, bound, self.device))
        masks = torch.full((sequences, block - 1), cfg.mask_token_id, dtype=torch.int64, device=self.device)
        offsets = torch.arange(block, device=self.device).expand(sequences, block)
        deepest = min(block - 1, budget)  # no node of a budget-B tree lies deeper than B: no logits past it
        longest = min(budget + 1, block)  # a path's most rows: the root and a draft per depth
        handed: list[Any] = []  # what a phase hands the next (then dropped)

        def draft() -> None:
            steps = r.steps
            tokens = torch.cat([steps.tokens[:, None], masks], dim=1)  # [P, block]
            noise = target.embed_tokens(tokens.reshape(-1)) * cfg.input_embedding_scale
            blocks = Forest(tokens, offsets, steps.slots, steps.context_lens, bound)
            hidden = drafter.draft_parts(noise, blocks, backend).view(sequences, block, -1)
            flat = hidden[:, 1 : deepest + 1].reshape(sequences * deepest, -1)
            handed[:] = [drafter.logits(flat, self.draft_head).view(sequences, deepest, -1)]

        def tree() -> None:
            (draft_logits,) = handed
            tokens, parents, depth = backend.build_trees(draft_logits, budget, r.steps.tokens)  # [P, N] each
            plans = [target.plan(parents[i], depth[i], backend, False) for i in range(sequences)]
            forest = Forest(tokens, depth, r.steps.slots, r.steps.context_lens, bound, plans)
            handed[:] = [forest, parents]

        def verify() -> None:
            forest, parents = handed
            logits, hidden = target.forward_parts(forest, backend, logits_dtype=None)
            handed[:] = [forest, parents, logits.view(sequences, budget + 1, -1), hidden]

        def walk() -> None:
            forest, parents, logits, hidden = handed
            handed[:] = [forest, hidden, *backend.tree_walk_parts(forest.tokens, parents, logits)]

        def commit() -> None:
            forest, hidden, path, path_len, bonus = handed
            handed.clear()
            target.commit_forest(forest, path, path_len, backend)
            keep = path[:, :longest].clamp(min=0)  # [P, M]: past a path's end, its root's row
            drafts = forest.tokens.gather(1, keep[:, 1:])
            r.outcome = torch.cat([path_len[:, None], bonus[:, None], drafts], dim=1)
            rows = hidden.view(sequences, budget + 1, -1)
            feats = rows.gather(1, keep[..., None].expand(-1, -1, rows.shape[-1]))  # [P, M, features]
            # every sequence's M rows from its old length: past its n accepted ones, rows the next
            # drafter block overwrites before it reads them (M <= block)
            kept = Forest(keep, offsets[:, :longest], r.steps.slots, r.steps.context_lens, bound)
            drafter.ingest_parts(feats.reshape(sequences * longest, -1), kept, backend)

        r.phases = [("draft", draft), ("tree", tree), ("verify", verify), ("walk", walk), ("commit", commit)]
        return r

    def _replay_steps(self, batch: list[Live], features: bool) -> tuple[Tensor, Tensor | None]:
        """Every sequence's root (committed) through the graph of a step of this many sequences
        (padded: its batch bucket's) under this key bound, with the rows' features for the drafter
        when asked (captured at its first use, from the states as they are), its buffers refilled:
        fp32 logits [P, V] and the features, valid until the next replay."""
        n, values = self._values(batch)
        key: StepKey = ("roots" if features else "ar", n, 0, max(self._bound(s) for s in batch))
        steps, out = self._step_graph(key, values)
        steps.fill(*values)
        assert self.step_graphs is not None
        self.step_graphs.replay(key)
        logits, hidden = out
        return logits[: len(batch)], hidden[: len(batch)] if hidden is not None else None

    def _step_graph(
        self, key: StepKey, values: tuple[list[int], list[int], list[int]]
    ) -> tuple[Steps, list[Tensor | None]]:
        """The step graph of `key` (mode "ar", or "roots": with the rows' features) and its
        buffers, captured at its first use from these values (their sequences' states as they are)."""
        assert self.step_graphs is not None
        if key not in self.step_graphs:
            steps, out = Steps.empty(key[1], key[3], self.device), []

            def step() -> None:  # the capture's output tensors are the ones its replays write
                out[:] = self.target.forward_parts(steps.forest(), self.backend, capture=key[0] == "roots")

            self.step_buffers[key] = steps, out
            # the warm-up run before the capture steps these sequences for real: their states are
            # put back (K/V rows rewrite)
            steps.fill(*values)
            restore = self.target.snapshot(sorted(set(values[1])))
            self.step_graphs.capture(key, [("steps", step)], restore)
        return self.step_buffers[key]

    def _greedy_walks(self, trees: list[_Tree], rows: Sequence[Tensor]) -> dict[int, Walk]:
        """Every greedy tree's walk (by `id` of its tree) in one call, on a backend that walks
        padded trees together (`tree_walk_parts`); none otherwise, and each slot walks its own."""
        walk_parts = getattr(self.backend, "tree_walk_parts", None)
        batch = [
            (t, r) for t, r in zip(trees, rows, strict=True) if t.tree is not None and t.live.sampling.greedy
        ]
        if walk_parts is None or len(batch) < 2:
            return {}
        n = max(t.tokens.shape[0] for t, _ in batch)
        # padding nodes: token -1 under the root, which no walk takes
        tokens = torch.full((len(batch), n), -1, dtype=torch.int64, device=self.device)
        parents = torch.zeros_like(tokens)
        logits = rows[0].new_zeros(len(batch), n, rows[0].shape[-1])
        for i, (t, r) in enumerate(batch):
            m = t.tokens.shape[0]
            tokens[i, :m], parents[i, :m], logits[i, :m] = t.tokens, t.parents, r
        path, path_len, bonus = walk_parts(tokens, parents, logits)
        return {
            id(t): (path[i, : t.tokens.shape[0]], path_len[i], bonus[i]) for i, (t, _) in enumerate(batch)
        }

    def _speculating(self, spec: list[Live], batch: list[Live], policy: BudgetPolicy) -> list[Live]:
        """Of the speculative slots `spec`, those that draft this round: the ddtree ones only if the
        policy keeps them on speculation, from their last curves (a slot that has not drafted yet:
        the latest curve of any slot)."""
        assert self.latest is not None
        auto = [s for s in spec if s.mode == "ddtree"]
        others = [s for s in batch if s.mode != "ddtree"]
        picked = policy.choose(
            [s.gains or self.latest for s in auto],
            [s.budget for s in auto],
            fixed_rows=[verify_rows(s.mode, self.block, s.budget) for s in others],
            fixed_tokens=sum(s.gains[-1] if s.gains else 1.0 for s in others),
            drafting=len(spec) - len(auto),
        )
        off = {id(s) for s, budget in zip(auto, picked, strict=True) if budget == 0}
        return [s for s in spec if id(s) not in off]

    def _ingest(self, spec: list[Live]) -> None:
        """Last round's accepted rows of every slot in `spec` into its drafter cache, in one pass."""
        assert self.drafter is not None
        fresh = [s for s in spec if s.feats is not None]
        if not fresh:
            return
        parts = []
        for s in fresh:
            assert s.feats is not None
            positions = torch.arange(s.ctx - s.feats.shape[0], s.ctx, device=self.device)
            parts.append(Part(s.slot, positions, positions, s.ctx - s.feats.shape[0]))
        self.drafter.ingest_parts(
            torch.cat([s.feats for s in fresh if s.feats is not None]), parts, self.backend
        )
        for s in fresh:
            s.feats = None

    def _draft(self, spec: list[Live]) -> Tensor:
        """Every speculative slot's block in one drafter pass: draft logits [S, B - 1, V] (fp32)."""
        assert self.drafter is not None
        cfg, block = self.drafter.config, self.block
        self._ingest(spec)
        roots = torch.tensor([s.root for s in spec], dtype=torch.int64, device=self.device)
        tokens = torch.full((len(spec), block), cfg.mask_token_id, dtype=torch.int64, device=self.device)
        tokens[:, 0] = roots
        noise = self.target.embed_tokens(tokens.reshape(-1)) * cfg.input_embedding_scale
        offsets = torch.arange(block, device=self.device)
        parts = [
            Part(s.slot, tokens[i], s.ctx + offsets, s.ctx, None, self._bound(s)) for i, s in enumerate(spec)
        ]
        hidden = self.drafter.draft_parts(noise, parts, self.backend).view(len(spec), block, -1)
        logits = self.drafter.logits(hidden[:, 1:].reshape(len(spec) * (block - 1), -1), self.draft_head)
        return logits.view(len(spec), block - 1, -1)

    def _bound(self, s: Live, root_alone: bool = False) -> int:
        """A slot's key bound this round, as `Engine.generate` sets it (bucketed on CUDA), so that
        its attention launches are the ones it gets alone; `root_alone`: it verifies its root alone
        this round (as `ar`: a ddtree slot off speculation reads no tree's keys)."""
        rows = verify_rows("ar" if root_alone else s.mode, self.block, s.budget)
        return key_bound(s.ctx + rows, self.max_context, bucketed=self.device.type == "cuda")

    def _tree(self, s: Live, draft_logits: Tensor | None) -> _Tree:
        """A slot's nodes: a ddtree of its budget, a dflash chain, or the root alone (`ar`, or a
        ddtree slot that did not draft)."""
        root = torch.tensor([s.root], dtype=torch.int64, device=self.device)
        if draft_logits is None:
            zero = torch.zeros(1, dtype=torch.int64, device=self.device)
            return _Tree(s, root, zero - 1, zero, None)
        if s.mode == "ddtree":
            tokens, parents, depth = self.backend.build_tree(draft_logits, s.budget, root[0])
        else:
            tokens = torch.cat([root, draft_logits.argmax(-1)])
            depth = torch.arange(tokens.shape[0], device=self.device)
            parents = depth - 1
        return _Tree(s, tokens, parents, depth, draft_logits)

    def _follow_load(self, trees: list[_Tree], policy: BudgetPolicy) -> bool:
        """Record every drafted slot's expected-token curve (the next round's prediction), then cut
        every drafted ddtree slot's tree (built at its request's budget) to the budget the policy
        picks for this round's load: its first B + 1 nodes, the best-B tree (B = 0: the root
        alone). Whether a ddtree slot speculates."""
        curves = {
            id(t): expected_gains(t.draft_logits, t.tokens, t.parents, t.depth)
            for t in trees
            if t.draft_logits is not None
        }
        for t in trees:
            if id(t) in curves:
                t.live.gains = self.latest = curves[id(t)]
        auto = [t for t in trees if t.live.mode == "ddtree" and id(t) in curves]
        if not auto:
            return False
        others = [t for t in trees if t.live.mode != "ddtree" or id(t) not in curves]
        picked = policy.choose(
            [curves[id(t)] for t in auto],
            [t.live.budget for t in auto],
            fixed_rows=[t.tokens.shape[0] for t in others],
            fixed_tokens=sum(curves[id(t)][-1] if id(t) in curves else 1.0 for t in others),
            drafting=sum(id(t) in curves for t in others),
        )
        for t, budget in zip(auto, picked, strict=True):
            t.tokens, t.parents, t.depth = (
                t.tokens[: budget + 1],
                t.parents[: budget + 1],
                t.depth[: budget + 1],
            )
        return any(picked)

    def _walk(
        self, t: _Tree, logits: Tensor, hidden: Tensor | None, walked: Walk | None
    ) -> tuple[list[int], list[TokenLogprob] | None]:
        """A slot's walk (unless `walked` already) and commit after an eager verify pass: its new
        tokens (accepted drafts, then the target's own next token) and, if asked, their logprobs
        (each at its parent's row)."""
        s, sampling = t.live, t.live.sampling
        if t.tree is None:  # the root alone: the pass already committed the row
            if s.mode != "ar":  # off speculation: the drafter reads its features at its next draft
                assert hidden is not None
                # a copy: on CUDA `hidden` is a step graph's output, which its next replay rewrites
                s.feats = hidden[:1].clone() if s.feats is None else torch.cat([s.feats, hidden[:1]])
            s.root = int(choose(logits[0], sampling))
            s.ctx += 1
            s.accepted.append(0)
            return [s.root], self._entries(s, logits[:1], [s.root])
        if walked is None:
            nucleus_logits = nucleus(logits, sampling.temperature, sampling.top_p)
            walked = self.backend.tree_walk(
                t.tokens, t.parents, nucleus_logits, sampling.temperature, sampling.generator
            )
        path, path_len, bonus = walked
        self.target.commit(s.ctx, t.tree, path, path_len, self.backend, s.slot)
        keep = path[: int(path_len)]
        assert hidden is not None
        tokens = self._advance(s, hidden[keep], t.tokens[keep[1:]].tolist(), int(bonus))
        return tokens, self._entries(s, logits[keep], tokens)

    @staticmethod
    def _advance(s: Live, feats: Tensor | None, drafts: list[int], bonus: int) -> list[int]:
        """A slot past its commit of its root and accepted `drafts` (whose rows' features `feats`
        the drafter reads next; None: it has read them): `bonus` its next root. Its new tokens: the
        drafts, then the bonus."""
        s.feats = feats
        s.root = bonus
        s.ctx += len(drafts) + 1
        s.accepted.append(len(drafts))
        return [*drafts, bonus]

    def _entries(self, s: Live, rows: Tensor, tokens: list[int]) -> list[TokenLogprob] | None:
        """The logprobs `s` asked for of `tokens`, each chosen at its row of the raw logits `rows`."""
        if s.logprobs is None:
            return None
        ids = torch.tensor(tokens, dtype=torch.int64, device=rows.device)
        values, top_ids = token_logprobs(rows, ids, self.buffers.top_ids.shape[1])
        return as_entries(tokens, values.tolist(), top_ids.tolist(), s.logprobs)

    def _finish(self, s: Live) -> None:
        """The sequence's result; its slot back to the free list."""
        s.result = GenerationResult(
            output_ids=s.out.ids,
            prompt_len=len(s.prompt),
            mode=s.mode,
            accepted_per_round=s.accepted,
            stop_reason=s.out.reason or "length",
            phase_s={"prefill": s.prefill_s},
            total_s=time.perf_counter() - s.added,
            text=s.out.text(),
            logprobs=s.out.logprobs if s.logprobs is not None else None,
        )
        self.live.remove(s)
        self.free.append(s.slot)
