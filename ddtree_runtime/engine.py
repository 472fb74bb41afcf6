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

The one host sync per round is reading the accepted length, which the stopping rules need anyway.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ddtree_runtime.backend import Backend, select_backend
from ddtree_runtime.models.dflash import DFlashDrafter
from ddtree_runtime.models.qwen3 import Qwen3
from specops_contract import MODES, verify_rows

PHASES = ("prefill", "draft", "tree", "verify", "walk", "compact")


class GenerationError(ValueError):
    """A request the engine cannot serve as given; the message says what to change."""


@dataclass
class GenerationResult:
    """Tokens and statistics of one generation, as data (callers choose how to show them)."""

    output_ids: list[int]
    prompt_len: int
    mode: str
    accepted_per_round: list[int]  # drafts the target accepted in each verify round
    stop_reason: str  # "eos" | "length" | "stop" | "cancelled"
    phase_s: dict[str, float] = field(default_factory=dict)
    total_s: float = 0.0
    text: str | None = None

    @property
    def rounds(self) -> int:
        return len(self.accepted_per_round)

    @property
    def mean_accepted(self) -> float:
        """τ: accepted drafts + 1 (the target's own token), averaged over rounds."""
        return sum(a + 1 for a in self.accepted_per_round) / self.rounds if self.rounds else 0.0

    @property
    def tokens_per_s(self) -> float:
        return len(self.output_ids) / self.total_s if self.total_s > 0 else 0.0

    def as_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "mode": self.mode,
            "output_ids": self.output_ids,
            "prompt_tokens": self.prompt_len,
            "rounds": self.rounds,
            "accepted_per_round": self.accepted_per_round,
            "mean_accepted": self.mean_accepted,
            "tokens_per_s": self.tokens_per_s,
            "total_s": self.total_s,
            "phase_s": self.phase_s,
            "stop_reason": self.stop_reason,
        }
        if self.text is not None:
            out["text"] = self.text
        return out


class _Clock:
    """Phase timer; on CUDA it synchronizes at phase boundaries only when profiling."""

    def __init__(self, sync: bool) -> None:
        self.sync = sync
        self.phase_s = dict.fromkeys(PHASES, 0.0)
        self.t = time.perf_counter()

    def lap(self, phase: str) -> None:
        if self.sync:
            torch.cuda.synchronize()
        now = time.perf_counter()
        self.phase_s[phase] += now - self.t
        self.t = now


class _Output:
    """Emitted tokens with the stopping rules: EOS, max_new_tokens, stop strings."""

    def __init__(
        self,
        max_new_tokens: int,
        eos_ids: set[int],
        stop: Sequence[str],
        decode: Callable[[list[int]], str] | None,
        on_tokens: Callable[[list[int]], bool] | None,
    ) -> None:
        self.ids: list[int] = []
        self.max_new, self.eos, self.stop, self.decode = max_new_tokens, eos_ids, tuple(stop), decode
        self.on_tokens = on_tokens
        self.reason: str | None = None

    def emit(self, tokens: list[int]) -> bool:
        """Append tokens one by one until a rule fires, then hand the round's tokens to
        `on_tokens` (False from it cancels); True when generation is over."""
        first = len(self.ids)
        for t in tokens:
            self.ids.append(t)
            if t in self.eos:
                self.reason = "eos"
            elif self.stop and self.decode is not None and any(s in self.decode(self.ids) for s in self.stop):
                self.reason = "stop"
            elif len(self.ids) >= self.max_new:
                self.reason = "length"
            if self.reason:
                break
        if self.on_tokens is not None and not self.on_tokens(self.ids[first:]) and not self.reason:
            self.reason = "cancelled"
        return self.reason is not None

    def text(self) -> str | None:
        if self.decode is None:
            return None
        text = self.decode(self.ids)
        cuts = [text.find(s) for s in self.stop if s in text]
        return text[: min(cuts)] if cuts else text


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


def _choose(logits: Tensor, temperature: float, generator: torch.Generator | None) -> Tensor:
    """logits: [V] -> 0-d token: argmax at T == 0, else a sample of softmax(logits / T)."""
    if temperature <= 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=generator)[0]


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
    """Owns the models, their static caches (allocated once at `max_context`) and the backend."""

    def __init__(
        self,
        target: Qwen3,
        drafter: DFlashDrafter | None,
        max_context: int,
        backend: Backend | None = None,
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
        target.setup_caches(max_context, capture)
        if drafter is not None:
            drafter.setup_caches(max_context)

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

    @torch.inference_mode()
    def generate(
        self,
        prompt_ids: Sequence[int],
        *,
        mode: str = "ddtree",
        budget: int = 64,
        max_new_tokens: int = 128,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int | None = None,
        eos_ids: Sequence[int] | None = None,
        stop: Sequence[str] = (),
        decode: Callable[[list[int]], str] | None = None,
        on_tokens: Callable[[list[int]], bool] | None = None,
        block_size: int | None = None,
        profile: bool = False,
    ) -> GenerationResult:
        """Generate up to `max_new_tokens` tokens after `prompt_ids`.

        EOS (kept in the output), stop strings (needs `decode`) and `on_tokens` returning False
        (called with each round's new tokens, e.g. to stream) end it early.
        """
        block = block_size or (self.drafter.config.block_size if self.drafter is not None else 2)
        self._check(mode, prompt_ids, max_new_tokens, budget, block)
        if temperature < 0:
            raise GenerationError(f"temperature {temperature} is negative (fix: 0 for greedy, > 0 to sample)")
        if not 0 < top_p <= 1:
            raise GenerationError(f"top_p {top_p} is outside (0, 1] (fix: 1.0 turns it off)")
        sampling = (temperature, top_p)
        generator = None
        if temperature > 0 and seed is not None:
            generator = torch.Generator(self.device).manual_seed(seed)
        eos = set(self.target.config.eos_token_ids if eos_ids is None else eos_ids)
        out = _Output(max_new_tokens, eos, stop, decode, on_tokens)
        clock = _Clock(profile and self.device.type == "cuda")
        start_time = time.perf_counter()

        prompt = torch.tensor(list(prompt_ids), dtype=torch.int64, device=self.device)
        n = prompt.shape[0]
        logits, hidden = self.target(
            prompt, torch.arange(n, device=self.device), 0, None, self.backend, capture=mode != "ar"
        )
        root = _choose(nucleus(logits[-1], temperature, top_p), temperature, generator)
        clock.lap("prefill")
        accepted: list[int] = []
        done = out.emit([int(root)])
        if mode == "ar":
            self._ar_loop(root, n, out, done, accepted, sampling, generator, clock)
        else:
            self._spec_loop(
                mode, root, n, hidden, out, done, accepted, budget, block, sampling, generator, clock
            )
        total = time.perf_counter() - start_time
        return GenerationResult(
            output_ids=out.ids,
            prompt_len=n,
            mode=mode,
            accepted_per_round=accepted,
            stop_reason=out.reason or "length",
            phase_s=clock.phase_s,
            total_s=total,
            text=out.text(),
        )

    def _ar_loop(
        self,
        root: Tensor,
        start: int,
        out: _Output,
        done: bool,
        accepted: list[int],
        sampling: tuple[float, float],
        generator: torch.Generator | None,
        clock: _Clock,
    ) -> None:
        """Plain decoding: one target pass per token."""
        temperature, top_p = sampling
        while not done:
            pos = torch.tensor([start], device=self.device)
            logits, _ = self.target(root.reshape(1), pos, start, None, self.backend, capture=False)
            root = _choose(nucleus(logits[0], temperature, top_p), temperature, generator)
            clock.lap("verify")
            start += 1
            accepted.append(0)
            done = out.emit([int(root)])

    def _spec_loop(
        self,
        mode: str,
        root: Tensor,
        start: int,
        features: Tensor,
        out: _Output,
        done: bool,
        accepted: list[int],
        budget: int,
        block: int,
        sampling: tuple[float, float],
        generator: torch.Generator | None,
        clock: _Clock,
    ) -> None:
        """Speculative rounds. `start`: committed target rows (= the root's position);
        `features`: target hidden states of the rows the drafter has not yet read, ending at start."""
        assert self.drafter is not None
        target, drafter, backend = self.target, self.drafter, self.backend
        temperature, top_p = sampling
        cfg = drafter.config
        masks = torch.full((block - 1,), cfg.mask_token_id, dtype=torch.int64, device=self.device)
        chain_parents = torch.arange(block, device=self.device) - 1
        chain_depth = torch.arange(block, device=self.device)
        while not done:
            # draft: [root, MASK x (block-1)] after the new context features
            noise = target.embed_tokens(torch.cat([root.reshape(1), masks])) * cfg.input_embedding_scale
            draft_hidden = drafter(features, start - features.shape[0], noise)  # [block, hidden]
            draft_logits = drafter.logits(draft_hidden[1:], target.lm_head)  # [block-1, V]
            clock.lap("draft")
            if mode == "ddtree":
                tokens, parents, depth = backend.build_tree(draft_logits, budget, root)
                visibility = backend.tree_visibility(parents, depth)
            else:
                tokens = torch.cat([root.reshape(1), draft_logits.argmax(-1)])
                parents, depth, visibility = chain_parents, chain_depth, None
            clock.lap("tree")
            logits, hidden = target(tokens, start + depth, start, visibility, backend)
            clock.lap("verify")
            logits = nucleus(logits, temperature, top_p)
            path, path_len, bonus = backend.tree_walk(tokens, parents, logits, temperature, generator)
            clock.lap("walk")
            if mode == "ddtree":  # a chain's accepted rows are already in place
                backend.compact(target.k_cache, target.v_cache, start, path, path_len)
            n = int(path_len)
            keep = path[:n]
            features = hidden[keep]  # [n, n_ids * hidden]: rows start .. start + n - 1
            new_tokens = torch.cat([tokens[keep[1:]], bonus.reshape(1)]).tolist()
            clock.lap("compact")
            accepted.append(n - 1)
            start += n
            root = bonus
            done = out.emit(new_tokens)
