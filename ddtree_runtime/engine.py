"""One decoding engine, three strategies: `ar`, `dflash` (a drafted chain) and `ddtree` (a drafted tree).

A speculative round: the drafter reads the context features committed since its last pass and
drafts one block from `[root, MASK x (B - 1)]`; the draft becomes a chain (dflash) or the `budget`
most probable prefixes (ddtree); the target verifies `[root] + nodes` in one pass at positions
`start + depth`; the walk follows the target's own choice (argmax, or a sample at T > 0) and the
first unmatched choice is the next root. Accepted K/V rows and hidden states move into place.
Because the target alone decides every token, each mode yields the `ar` tokens at T = 0 and the
target's distribution at T > 0 (target-only verification: a draft is kept only when it equals the
target's own sample at its parent; exact, though a chain accepts less often than with rejection
sampling against the draft distribution).

Rounds run on static buffers (`rounds.py`); on CUDA a greedy round is one replayed CUDA graph
(`graphs.py`), captured at `warmup` for every mode, budget and context bucket serving can hit.
The one host sync per round is reading the accepted tokens, which the stopping rules need anyway.

Logprobs (asked per request) are the target's own: each emitted token's log_softmax of the raw
logits where it was chosen (the prefill's last row for the first token, then its parent on the
accepted path), in fp32. A round that records them runs eagerly (on CUDA too): its extra step
(`RoundBuffers.record_logprobs`) writes static buffers and needs no sync, so it could join the
captured graphs, at the price of a second set of them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ddtree_kernels.host import fp8_tensor_cores
from ddtree_runtime.backend import Backend, select_backend
from ddtree_runtime.generation import GenerationResult, Output, PhaseClock
from ddtree_runtime.graphs import GraphKey, RoundGraphs, buckets, key_bound
from ddtree_runtime.logprobs import MAX_LOGPROBS, TokenLogprob, as_entries, prompt_logprobs, token_logprobs
from ddtree_runtime.models.dflash import DFlashDrafter
from ddtree_runtime.models.target import Target
from ddtree_runtime.quant import Fp8Linear
from ddtree_runtime.rounds import Phase, RoundBuffers, Sampling, ar_phases, choose, spec_phases
from specops_contract import MODES, SERVE_OPTIONS, verify_rows

DRAFT_HEAD_BLOCK = (128, 128)  # Qwen's weight_block_size, the blocks the FP8 kernels are tuned for
FP8_DRAFT_HEAD = {"auto": None, "fp8": True, "target": False}  # --draft-head: the engines' fp8_draft_head


class GenerationError(ValueError):
    """A request the engine cannot serve as given; the message says what to change."""


def graphs_allowed(target: Target, backend: Backend[Any, Any, Any]) -> bool:
    """Whether rounds may be CUDA graphs by default: on CUDA, when the target and the backend both
    allow it (no host work in the target's pass or the backend's seams)."""
    return target.embed_tokens.weight.device.type == "cuda" and target.graphable and backend.capturable


def draft_head(lm_head: nn.Linear | Fp8Linear, fp8: bool | None = None) -> nn.Linear | Fp8Linear:
    """The head the drafter's logits go through: the target's own, or (`fp8`; by default for a
    16-bit head on a GPU with FP8 tensor cores) an e4m3 copy in Qwen's (128, 128) blocks, which
    reads half the bytes every round (the 27B's head is 2.5 GB in bf16). Lossless either way: the
    target verifies every draft, so only acceptance can move."""
    if isinstance(lm_head, Fp8Linear):  # an FP8 checkpoint's own head
        return lm_head
    weight = lm_head.weight
    if fp8 is None:
        sixteen_bit = weight.dtype in (torch.bfloat16, torch.float16)
        fp8 = sixteen_bit and weight.device.type == "cuda" and fp8_tensor_cores(weight.device)
    return Fp8Linear.quantized(lm_head, DRAFT_HEAD_BLOCK) if fp8 else lm_head


def tree_capacity(vocab: int, depth: int, cap: int = 1 << 30) -> int:
    """Distinct prefixes of length 1..depth over `vocab` tokens (the most nodes a tree can have),
    counted up to `cap`."""
    total, level = 0, 1
    for _ in range(depth):
        level *= vocab
        total += level
        if total >= cap:
            return cap
    return total


class Engine:
    """Owns the models, their static caches (allocated once at `max_context`), the round buffers,
    the backend and, on CUDA, the captured round graphs."""

    def __init__(
        self,
        target: Target,
        drafter: DFlashDrafter | None,
        max_context: int,
        backend: Backend[Any, Any, Any] | None = None,
        graphs: bool | None = None,
        slots: int = 1,
        fp8_draft_head: bool | None = None,
    ) -> None:
        cfg = target.config
        if max_context > cfg.max_position_embeddings:
            raise GenerationError(
                f"max_context {max_context} exceeds the target's max_position_embeddings "
                f"{cfg.max_position_embeddings} (fix: lower --max-context)"
            )
        self.target, self.drafter = target, drafter
        self.device = target.embed_tokens.weight.device
        self.backend = backend or select_backend(self.device)
        capture = drafter.config.target_layer_ids if drafter is not None else ()
        target.setup_caches(max_context, capture, slots)  # `generate` runs in slot 0
        if drafter is not None:
            drafter.setup_caches(max_context, slots)
        self.draft_head = (
            draft_head(target.lm_head, fp8_draft_head) if drafter is not None else target.lm_head
        )
        block = drafter.config.block_size if drafter is not None else 1
        features = max(1, len(capture) * cfg.hidden_size)
        self.buffers = RoundBuffers.allocate(
            block, features, self.device, target.embed_tokens.weight.dtype, min(MAX_LOGPROBS, cfg.vocab_size)
        )
        if graphs is None:
            graphs = graphs_allowed(target, self.backend)
        self.graphs = RoundGraphs(self.device) if graphs else None
        self.warmed: set[GraphKey] | None = None  # after warmup: the only rounds served

    @property
    def max_context(self) -> int:
        return self.target.max_context

    def _check(
        self, mode: str, prompt: Sequence[int], max_new_tokens: int, budget: int, block_size: int
    ) -> None:
        """Refuse a request the caches or the tree cannot hold, before any work."""
        if mode not in MODES:
            raise GenerationError(f"unknown mode {mode!r} (fix: one of {', '.join(MODES)})")
        if mode != "ar" and self.drafter is None:
            raise GenerationError(f"mode {mode!r} needs a drafter (fix: pass --drafter DIR or use --mode ar)")
        if not prompt:
            raise GenerationError("the prompt is empty (fix: give at least one token)")
        vocab = self.target.config.vocab_size
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise GenerationError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {vocab})")
        if max_new_tokens < 1:
            raise GenerationError(f"max_new_tokens is {max_new_tokens} (fix: ask for at least 1)")
        if block_size < 2:
            raise GenerationError(f"block_size {block_size} leaves nothing to draft (fix: at least 2)")
        capacity = tree_capacity(vocab, block_size - 1)
        if mode == "ddtree" and not 1 <= budget <= capacity:
            raise GenerationError(
                f"budget {budget} does not fit a tree of depth {block_size - 1} over {vocab} tokens "
                f"(fix: a budget from 1 to {capacity})"
            )
        rows = verify_rows(mode, block_size, budget)
        need = len(prompt) + max_new_tokens + rows
        if need > self.max_context:
            raise GenerationError(
                f"a prompt of {len(prompt)} tokens + max_new_tokens {max_new_tokens} + {rows} verify rows "
                f"needs {need} positions, but max_context is {self.max_context} (fix: shorten the prompt, "
                "lower max_new_tokens or the budget, or raise --max-context)"
            )
        if self.warmed is not None and self.graphs is not None:
            served = sorted({(m, b) for m, b, _ in self.warmed})
            if (mode, budget if mode == "ddtree" else 0) not in served:
                raise GenerationError(
                    f"mode {mode!r}"
                    + (f" with budget {budget}" if mode == "ddtree" else "")
                    + " was not warmed up at load (fix: one of "
                    + ", ".join(m if m != "ddtree" else f"ddtree/{b}" for m, b in served)
                    + ", or restart with it in the served set)"
                )

    def _phases(
        self,
        mode: str,
        budget: int,
        bound: int,
        sampling: Sampling,
        buf: RoundBuffers | None = None,
        logprobs: bool = False,
    ) -> list[Phase]:
        buf = buf or self.buffers
        if mode == "ar":
            return ar_phases(self.target, self.backend, buf, bound, sampling, logprobs)
        assert self.drafter is not None
        block = buf.feats.shape[0]
        return spec_phases(
            self.target,
            self.drafter,
            self.draft_head,
            self.backend,
            buf,
            mode,
            budget,
            block,
            bound,
            sampling,
            logprobs,
        )

    def _capture(self, mode: str, budget: int, bound: int) -> None:
        """Capture one greedy round graph; the buffers come back as they were."""
        assert self.graphs is not None
        buf = self.buffers
        rows = verify_rows(mode, buf.feats.shape[0], budget)
        if int(buf.ctx) + rows > bound:  # the last generation ran past this bucket: any length in it
            buf.ctx.fill_(bound - rows)
            buf.n_feats.fill_(1)
        restore_buffers, restore_target = buf.snapshot(), self.target.snapshot()

        def reset() -> None:
            restore_buffers()
            restore_target()

        self.graphs.capture((mode, budget, bound), self._phases(mode, budget, bound, Sampling()), reset)

    @torch.inference_mode()
    def warmup(self, modes: Sequence[str], budgets: Sequence[int], max_prompt: int | None = None) -> None:
        """Build everything serving can hit before it serves: on CUDA one round graph per mode,
        budget and context bucket, a sampled round of each (the sampling kernels), and prefills
        at lengths covering every launch plan the prefill can take, so that no request pays a
        Triton compile. After it, a request for a mode or budget outside these is refused."""
        block = self.drafter.config.block_size if self.drafter is not None else 2
        pairs = sorted({(m, b if m == "ddtree" else 0) for m in modes for b in budgets})
        if self.graphs is None:  # nothing to compile or capture: one short run per pair
            for mode, budget in pairs:
                self.generate([0] * 8, mode=mode, budget=max(budget, 1), max_new_tokens=2 * block, eos_ids=())
            return
        for mode, budget in pairs:
            for bound in buckets(self.max_context):
                if verify_rows(mode, block, budget) < bound:
                    self._capture(mode, budget, bound)
        first = next((m for m, _ in pairs if m != "ar"), pairs[0][0])
        for length in prefill_lengths(max_prompt or self.max_context // 2, self.max_context):
            self.generate([0] * length, mode=first, budget=max(budgets), max_new_tokens=1, eos_ids=())
        for mode, budget in pairs:  # the sampling kernels (sampled rounds run eagerly)
            self.generate(
                [0] * 8,
                mode=mode,
                budget=max(budget, 1),
                max_new_tokens=2 * block,
                eos_ids=(),
                temperature=0.7,
                seed=0,
            )
        self.warmed = set(self.graphs.graphs)

    @torch.inference_mode()
    def generate(
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
        block_size: int | None = None,
        profile: bool = False,
        logprobs: int | None = None,
        on_logprobs: Callable[[list[TokenLogprob]], None] | None = None,
        prompt_top: int | None = None,
    ) -> GenerationResult:
        """Generate up to `max_new_tokens` tokens after `prompt_ids`.

        EOS (kept in the output) and stop strings (needs `decode`) end it early; `on_tokens` gets
        each round's new tokens (e.g. to stream). Setting `cancel` from another thread stops it
        before its next phase (a graphed round: before its next round), with the tokens so far.
        `profile` runs the phases one by one with a sync between them, for the per-phase split.
        `logprobs` (0 to `MAX_LOGPROBS`; None: off) asks for each token's logprob and that many
        top ones (`GenerationResult.logprobs`; `on_logprobs` gets each round's, before
        `on_tokens`). `prompt_top` (the same range) asks the same of every prompt token after the
        first, with its rank (`GenerationResult.prompt_logprobs`).
        """
        full_block = self.drafter.config.block_size if self.drafter is not None else 2
        block = block_size or full_block
        self._check(mode, prompt_ids, max_new_tokens, budget, block)
        top = self.buffers.top_ids.shape[1]
        for name, asked in (("logprobs", logprobs), ("prompt_top", prompt_top)):
            if asked is not None and not 0 <= asked <= top:
                raise GenerationError(f"{name} {asked} is outside [0, {top}] (fix: ask for at most {top})")
        sampling = self._sampling(temperature, top_p, seed)
        eos = set(self.target.config.eos_token_ids if eos_ids is None else eos_ids)
        out = Output(max_new_tokens, eos, stop, decode, on_tokens, cancel, on_logprobs)
        clock = PhaseClock(profile and self.device.type == "cuda")
        start_time = time.perf_counter()
        buf, root, last_logits, prompt_entries = self._prefill(prompt_ids, mode, sampling, block, prompt_top)
        first = None
        if logprobs is not None:
            values, ids = token_logprobs(last_logits[None], root.reshape(1), top)
            first = as_entries([int(root)], values.tolist(), ids.tolist(), logprobs)
        done = out.emit([int(root)], first)  # a sync: the prefill's GPU time stays in its own phase
        clock.lap("prefill")
        accepted: list[int] = []
        if not done:
            graphed = (
                self.graphs is not None
                and sampling.greedy
                and not profile
                and block == full_block
                and logprobs is None
            )
            self._rounds(
                mode,
                budget if mode == "ddtree" else 0,
                buf,
                len(prompt_ids),
                sampling,
                graphed,
                out,
                clock,
                accepted,
                logprobs,
            )
        return GenerationResult(
            output_ids=out.ids,
            prompt_len=len(prompt_ids),
            mode=mode,
            accepted_per_round=accepted,
            stop_reason=out.reason or "length",
            phase_s=clock.phase_s,
            total_s=time.perf_counter() - start_time,
            text=out.text(),
            logprobs=out.logprobs if logprobs is not None else None,
            prompt_logprobs=prompt_entries,
        )

    def _sampling(self, temperature: float, top_p: float, seed: int | None) -> Sampling:
        if temperature < 0:
            raise GenerationError(f"temperature {temperature} is negative (fix: 0 for greedy, > 0 to sample)")
        if not 0 < top_p <= 1:
            raise GenerationError(f"top_p {top_p} is outside (0, 1] (fix: 1.0 turns it off)")
        generator = None
        if temperature > 0 and seed is not None:
            generator = torch.Generator(self.device).manual_seed(seed)
        return Sampling(temperature, top_p, generator)

    def _prefill(
        self, prompt_ids: Sequence[int], mode: str, sampling: Sampling, block: int, prompt_top: int | None
    ) -> tuple[RoundBuffers, Tensor, Tensor, list[TokenLogprob] | None]:
        """The prompt through the target (and its features into the drafter); the round buffers set
        up after it (a test's other block size gets buffers of its own), the first token, the
        logits [V] it was chosen from and, with `prompt_top`, the prompt's logprobs."""
        prompt = torch.tensor(list(prompt_ids), dtype=torch.int64, device=self.device)
        n = prompt.shape[0]
        positions = torch.arange(n, device=self.device)
        logits, hidden = self.target(
            prompt,
            positions,
            0,
            None,
            self.backend,
            capture=mode != "ar",
            last_logits_only=True,
            final_hidden=prompt_top is not None,
        )
        prompt_entries = None
        if prompt_top is not None:  # the LM head a chunk of rows at a time, never [T, V] at once
            vocab = self.target.config.vocab_size
            prompt_entries = prompt_logprobs(logits, prompt, self.target.lm_head, vocab, prompt_top)
            logits = self.target.lm_head(logits[-1:]).float()
        root = choose(logits[-1], sampling)
        if mode != "ar":
            assert self.drafter is not None and hidden is not None
            self.drafter.ingest(hidden, 0, self.backend)
        buf = self.buffers
        if block != buf.feats.shape[0] and mode != "ar":
            buf = RoundBuffers.allocate(
                block, buf.feats.shape[1], self.device, buf.feats.dtype, buf.top_ids.shape[1]
            )
        buf.start(root, n)
        return buf, root, logits[-1], prompt_entries

    def _rounds(
        self,
        mode: str,
        budget: int,
        buf: RoundBuffers,
        n: int,
        sampling: Sampling,
        graphed: bool,
        out: Output,
        clock: PhaseClock,
        accepted: list[int],
        logprobs: int | None = None,
    ) -> None:
        """Rounds until a stopping rule fires: a replayed graph (or the phases one by one), then
        the round's one host sync, which reads the accepted tokens (and their logprobs, if asked)."""
        rows = verify_rows(mode, buf.feats.shape[0], budget)
        phases: dict[int, list[Phase]] = {}
        done = False
        while not done:
            # CUDA buckets the key bound with or without graphs, so that both run the same launches
            bound = key_bound(n + rows, self.max_context, bucketed=self.device.type == "cuda")
            if graphed:
                assert self.graphs is not None
                if (mode, budget, bound) not in self.graphs:
                    self._capture(mode, budget, bound)
                self.graphs.replay((mode, budget, bound))
            else:
                if bound not in phases:
                    phases[bound] = self._phases(mode, budget, bound, sampling, buf, logprobs is not None)
                for name, run in phases[bound]:
                    if out.cancelled():  # a cut round leaves no state the next prefill keeps
                        return
                    run()
                    clock.lap(name)
            result = buf.out.tolist()
            if graphed:
                clock.lap("round")
            n += result[0]
            accepted.append(result[0] - 1)
            tokens = result[1 : 1 + result[0]]
            entries = None
            if logprobs is not None:
                m = len(tokens)
                entries = as_entries(tokens, buf.logprobs[:m].tolist(), buf.top_ids[:m].tolist(), logprobs)
            done = out.emit(tokens, entries)


def prefill_lengths(max_prompt: int, max_context: int) -> list[int]:
    """Prompt lengths whose prefills take every launch plan shorter prompts can: each small length,
    then powers of two and their odd neighbours (tile and split boundaries), up to `max_prompt`."""
    lengths = set(range(1, 18))
    p = 16
    while p <= max_prompt:
        lengths |= {p - 1, p, p + 1, p + p // 2 + 1}
        p *= 2
    return sorted(n for n in lengths if n <= min(max_prompt, max_context - 64))
