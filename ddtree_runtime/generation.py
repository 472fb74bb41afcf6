"""What one generation returns (tokens and statistics, as data) and what decides when it ends.

`Engine.generate` fills these; the CLI and the server choose how to show them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import torch

from ddtree_runtime.logprobs import TokenLogprob

# "round": a whole round replayed as one CUDA graph (its phases are not split; `profile` splits them)
PHASES = ("prefill", "draft", "tree", "verify", "walk", "compact", "round")


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
    logprobs: list[TokenLogprob] | None = None  # one per output id, when asked for
    prompt_logprobs: list[TokenLogprob] | None = None  # one per prompt id after the first, when asked for

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
        for name, logprobs in (("logprobs", self.logprobs), ("prompt_logprobs", self.prompt_logprobs)):
            if logprobs is not None:
                out[name] = [asdict(e) for e in logprobs]
        return out


class PhaseClock:
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


class IncrementalText:
    """The text of a growing list of token ids, decoding only a small window per step.

    Decoding every id after every new one is quadratic: a 32K-token output spent about a minute in
    its stop-string check. Here each step decodes the ids since the last stable point, with the ids
    before it as context (a tokenizer may drop a word's leading space at the start of a decode), and
    hands out what that added once it is stable: it extends the window's earlier text and does not
    end in a partial UTF-8 character (U+FFFD). What it has handed out, joined, is always a prefix of
    ``decode(ids)``; callers keep only the part they need.
    """

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self.decode = decode
        self.ids: list[int] = []
        self._context = 0  # ids[_context:_read] decode to the end of what was handed out
        self._read = 0  # ids before this are handed out

    def push(self, ids: Sequence[int]) -> str:
        """Append ``ids``; returns the text this adds (maybe "" for now)."""
        self.ids.extend(ids)
        before = self.decode(self.ids[self._context : self._read])
        after = self.decode(self.ids[self._context :])
        if len(after) <= len(before) or not after.startswith(before) or after.endswith("\ufffd"):
            return ""
        self._context, self._read = self._read, len(self.ids)
        return after[len(before) :]


def first_stop(text: str, added: int, stop: Sequence[str]) -> int | None:
    """Where the first of ``stop`` begins in ``text``, given that it was absent before the last
    ``added`` characters arrived: only that tail (and a stop's length before it) is searched."""
    start = max(0, len(text) - added - max((len(s) for s in stop), default=0) + 1)
    hits = [i for s in stop if (i := text.find(s, start)) >= 0]
    return min(hits) if hits else None


class Output:
    """Emitted tokens (and their logprobs, when asked for) with the stopping rules: EOS,
    max_new_tokens, stop strings."""

    def __init__(
        self,
        max_new_tokens: int,
        eos_ids: set[int],
        stop: Sequence[str],
        decode: Callable[[list[int]], str] | None,
        on_tokens: Callable[[list[int]], None] | None,
        cancel: threading.Event | None,
        on_logprobs: Callable[[list[TokenLogprob]], None] | None = None,
    ) -> None:
        self.ids: list[int] = []
        self.logprobs: list[TokenLogprob] = []
        self.on_logprobs = on_logprobs
        self.max_new, self.eos, self.stop, self.decode = max_new_tokens, eos_ids, tuple(stop), decode
        self.on_tokens, self.cancel = on_tokens, cancel
        self.reason: str | None = None
        self.seen = IncrementalText(decode) if decode is not None and self.stop else None
        self.recent = ""  # the end of the text so far, one character shorter than the longest stop

    def emit(self, tokens: list[int], logprobs: list[TokenLogprob] | None = None) -> bool:
        """Append tokens one by one until a rule fires, then hand the round's logprobs (if given)
        to `on_logprobs` and its tokens to `on_tokens`; True when generation is over."""
        first = len(self.ids)
        for t in tokens:
            self.ids.append(t)
            if t in self.eos:
                self.reason = "eos"
            elif self.seen is not None and self._stopped(t):
                self.reason = "stop"
            elif len(self.ids) >= self.max_new:
                self.reason = "length"
            if self.reason:
                break
        if logprobs is not None:
            self.logprobs += logprobs[: len(self.ids) - first]
            if self.on_logprobs is not None:
                self.on_logprobs(self.logprobs[first:])
        if self.on_tokens is not None:
            self.on_tokens(self.ids[first:])
        return self.cancelled() or self.reason is not None

    def _stopped(self, token: int) -> bool:
        """Whether a stop string appears once ``token`` is decoded (only the new text is searched)."""
        assert self.seen is not None
        added = self.seen.push([token])
        window = self.recent + added
        keep = max(len(s) for s in self.stop) - 1
        self.recent = window[max(0, len(window) - keep) :]
        return first_stop(window, len(added), self.stop) is not None

    def cancelled(self) -> bool:
        """True once `cancel` is set (from any thread) before another rule ended the generation."""
        if self.reason is None and self.cancel is not None and self.cancel.is_set():
            self.reason = "cancelled"
        return self.reason == "cancelled"

    def text(self) -> str | None:
        if self.decode is None:
            return None
        text = self.decode(self.ids)
        cut = first_stop(text, len(text), self.stop)
        return text if cut is None else text[:cut]
