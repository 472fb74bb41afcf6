"""End-to-end decoding on tiny real checkpoints: exactness at T = 0, acceptance, stopping, refusals."""

from __future__ import annotations

import json
import random
import shutil
import threading
from pathlib import Path

import pytest
import torch

from ddtree_runtime.config import ConfigError
from ddtree_runtime.engine import Engine, GenerationError
from ddtree_runtime.loader import load_pair
from ddtree_runtime.tiny import SPECIALS, TinyPair
from ddtree_runtime.tokenizer import Tokenizer
from tests.runtime.helpers import assert_same_tokens, engine_for

N_WORDS = 64
BUDGETS = (1, 2, 7, 64, 256)


def prompts(seed: int, count: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[len(SPECIALS) + rng.randrange(N_WORDS) for _ in range(rng.randint(1, 12))] for _ in range(count)]


@pytest.fixture(scope="module")
def engine(tiny_pair: TinyPair, device: torch.device, dtype: torch.dtype) -> Engine:
    return engine_for(tiny_pair, device, dtype)


@pytest.fixture(scope="module")
def mixed_engine(mixed_pair: TinyPair, device: torch.device, dtype: torch.dtype) -> Engine:
    return engine_for(mixed_pair, device, dtype)


def test_ar_equals_transformers_greedy_generate(
    tiny_pair: TinyPair, engine: Engine, device: torch.device, dtype: torch.dtype
) -> None:
    transformers = pytest.importorskip("transformers")
    hf = transformers.Qwen3ForCausalLM.from_pretrained(tiny_pair.target, dtype=dtype).to(device).eval()
    for prompt in prompts(7, 4):
        ours = engine.generate(prompt, mode="ar", max_new_tokens=24).output_ids
        with torch.inference_mode():
            out = hf.generate(
                torch.tensor([prompt], device=device), max_new_tokens=24, do_sample=False, pad_token_id=0
            )
        assert_same_tokens(engine, prompt, out[0, len(prompt) :].tolist(), ours, dtype)


@pytest.mark.parametrize("block_size", [2, 4, 6, 9])
def test_speculative_modes_give_the_ar_tokens(engine: Engine, block_size: int, dtype: torch.dtype) -> None:
    for prompt in prompts(block_size, 4):
        want = engine.generate(prompt, mode="ar", max_new_tokens=40).output_ids
        got = engine.generate(prompt, mode="dflash", max_new_tokens=40, block_size=block_size)
        assert_same_tokens(engine, prompt, want, got.output_ids, dtype)
        vocab = engine.target.config.vocab_size
        for budget in (b for b in BUDGETS if b <= sum(vocab**d for d in range(1, block_size))):
            got = engine.generate(
                prompt, mode="ddtree", budget=budget, max_new_tokens=40, block_size=block_size
            )
            assert_same_tokens(engine, prompt, want, got.output_ids, dtype)


def test_unfitted_mixed_layer_drafter_is_still_exact(mixed_engine: Engine, dtype: torch.dtype) -> None:
    for prompt in prompts(11, 4):
        want = mixed_engine.generate(prompt, mode="ar", max_new_tokens=30).output_ids
        for mode, budget in [("dflash", 1), *(("ddtree", b) for b in BUDGETS)]:
            got = mixed_engine.generate(prompt, mode=mode, budget=budget, max_new_tokens=30)
            assert_same_tokens(mixed_engine, prompt, want, got.output_ids, dtype)


def test_fitted_drafts_are_accepted_three_and_more_at_a_time(engine: Engine, dtype: torch.dtype) -> None:
    for mode in ("dflash", "ddtree"):
        accepted = []
        for prompt in prompts(3, 4):
            want = engine.generate(prompt, mode="ar", max_new_tokens=48).output_ids
            got = engine.generate(prompt, mode=mode, budget=32, max_new_tokens=48)
            assert_same_tokens(engine, prompt, want, got.output_ids, dtype)
            assert got.rounds == len(got.accepted_per_round) < len(want)
            assert got.mean_accepted == pytest.approx(sum(a + 1 for a in got.accepted_per_round) / got.rounds)
            accepted += got.accepted_per_round
        assert max(accepted) >= 3, (mode, accepted)
        assert sum(a >= 3 for a in accepted) >= 3, (mode, accepted)


def test_compaction_leaves_the_ar_kv_cache(engine: Engine, dtype: torch.dtype) -> None:
    """After a ddtree run the committed cache rows equal those of plain decoding."""
    prompt = prompts(5, 1)[0]
    ar = engine.generate(prompt, mode="ar", max_new_tokens=30)
    rows = len(prompt) + len(ar.output_ids) - 1
    k_ar, v_ar = engine.target.k_cache[:, :, :rows].clone(), engine.target.v_cache[:, :, :rows].clone()
    tree = engine.generate(prompt, mode="ddtree", budget=16, max_new_tokens=30)
    assert max(tree.accepted_per_round) >= 2
    if dtype == torch.float32:
        assert tree.output_ids == ar.output_ids
        # rows the rounds committed (the last round may accept past max_new_tokens)
        n = min(rows, len(prompt) + sum(a + 1 for a in tree.accepted_per_round))
        for ours, want in [(engine.target.k_cache, k_ar), (engine.target.v_cache, v_ar)]:
            torch.testing.assert_close(ours[:, :, :n], want[:, :, :n], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mode", ["ar", "dflash", "ddtree"])
def test_never_emits_past_max_new_tokens(engine: Engine, mode: str) -> None:
    prompt = prompts(1, 1)[0]
    full = engine.generate(prompt, mode="ar", max_new_tokens=20).output_ids
    for n in (1, 2, 3, 7, 20):
        got = engine.generate(prompt, mode=mode, budget=32, max_new_tokens=n)
        assert len(got.output_ids) == n and got.stop_reason == "length"
        if engine.target.embed_tokens.weight.dtype == torch.float32:
            assert got.output_ids == full[:n]


@pytest.mark.parametrize("mode", ["ar", "dflash", "ddtree"])
def test_stops_at_eos_and_keeps_it(engine: Engine, mode: str) -> None:
    prompt = prompts(2, 1)[0]
    full = engine.generate(prompt, mode="ar", max_new_tokens=20).output_ids
    eos = full[9]
    cut = full.index(eos) + 1
    got = engine.generate(prompt, mode=mode, budget=32, max_new_tokens=20, eos_ids=[eos])
    assert got.stop_reason == "eos" and got.output_ids[-1] == eos and len(got.output_ids) == cut


def test_stop_strings_cut_the_text(tiny_pair: TinyPair, engine: Engine) -> None:
    tok = Tokenizer(tiny_pair.target)
    prompt = tok.prompt_ids("the city of war")
    full = engine.generate(prompt, mode="ar", max_new_tokens=20, decode=tok.decode)
    word = full.text.split()[6]
    for mode in ("ar", "dflash", "ddtree"):
        got = engine.generate(prompt, mode=mode, max_new_tokens=20, stop=[word], decode=tok.decode)
        assert got.stop_reason == "stop"
        assert word not in got.text and full.text.startswith(got.text)
        assert tok.decode(got.output_ids).endswith(word)


def test_chat_template_and_tokenizer_round_trip(tiny_pair: TinyPair) -> None:
    tok = Tokenizer(tiny_pair.target)
    ids = tok.prompt_ids("the city")
    assert ids[0] == tok.token_id("<|im_start|>") and tok.decode(ids) == "user the city assistant"
    assert tok.eos_token_id == SPECIALS.index("<|im_end|>")


def test_a_broken_chat_template_is_refused_at_load(tiny_pair: TinyPair, tmp_path: Path) -> None:
    copy = shutil.copytree(tiny_pair.target, tmp_path / "target")
    cfg = json.loads((copy / "tokenizer_config.json").read_text())
    cfg["chat_template"] = "{% for m in messages %}\n{{ m.content }\n{% endfor %}"
    (copy / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=r"target: chat template line 2: unexpected '}'"):
        Tokenizer(copy)


def test_clear_refusals(engine: Engine) -> None:
    with pytest.raises(GenerationError, match="max_context is 512"):
        engine.generate(list(range(5, 60)) * 9, mode="ddtree", max_new_tokens=10)
    with pytest.raises(GenerationError, match=r"budget 70 does not fit a tree of depth 1 over 69 tokens"):
        engine.generate([5, 6], mode="ddtree", budget=70, block_size=2)
    with pytest.raises(GenerationError, match="unknown mode"):
        engine.generate([5, 6], mode="eagle")
    with pytest.raises(GenerationError, match="empty"):
        engine.generate([], mode="ar")
    with pytest.raises(GenerationError, match=r"\[9999\] are outside the vocabulary \[0, 69\)"):
        engine.generate([5, 9999], mode="ar")
    with pytest.raises(GenerationError, match="top_p"):
        engine.generate([5, 6], mode="ddtree", temperature=1.0, top_p=0.0)


@pytest.mark.parametrize(
    ("field", "value", "code"),
    [("hidden_size", 32, "DFL040"), ("vocab_size", 50, "DFL041"), ("num_target_layers", 9, "DFL023")],
)
def test_a_drafter_that_does_not_fit_is_refused_at_load(
    tiny_pair: TinyPair, tmp_path: Path, field: str, value: int, code: str
) -> None:
    drafter = tmp_path / "drafter"
    shutil.copytree(tiny_pair.drafter, drafter)
    raw = json.loads((drafter / "config.json").read_text())
    raw[field] = value
    (drafter / "config.json").write_text(json.dumps(raw, indent=2))
    with pytest.raises(ConfigError, match=code):
        load_pair(tiny_pair.target, drafter, torch.device("cpu"), torch.float32)


@pytest.mark.parametrize("mode", ["ar", "dflash", "ddtree"])
def test_on_tokens_streams_each_round_and_cancel_stops_it(engine: Engine, mode: str) -> None:
    prompt = prompts(4, 1)[0]
    chunks: list[list[int]] = []
    got = engine.generate(prompt, mode=mode, budget=16, max_new_tokens=20, on_tokens=chunks.append)
    assert [t for c in chunks for t in c] == got.output_ids and len(chunks) == got.rounds + 1
    cancel = threading.Event()
    cancelled = engine.generate(
        prompt, mode=mode, budget=16, max_new_tokens=20, on_tokens=lambda _: cancel.set(), cancel=cancel
    )
    assert cancelled.stop_reason == "cancelled" and cancelled.output_ids == got.output_ids[:1]


@pytest.mark.parametrize("mode", ["ar", "ddtree"])
def test_a_cancel_from_another_thread_cuts_a_round_and_leaves_no_trace(engine: Engine, mode: str) -> None:
    """Cancelled at arbitrary points (between phases of a round too): the output so far is a prefix
    of the full one, and the next generation is unaffected by the cut round."""
    prompt = prompts(6, 1)[0]
    full = engine.generate(prompt, mode=mode, budget=16, max_new_tokens=400, eos_ids=())
    for delay in (0.0, 0.003, 0.011, 0.027):
        cancel = threading.Event()
        timer = threading.Timer(delay, cancel.set)
        timer.start()
        cut = engine.generate(prompt, mode=mode, budget=16, max_new_tokens=400, eos_ids=(), cancel=cancel)
        timer.join()
        assert cut.stop_reason == "cancelled" and full.output_ids[: len(cut.output_ids)] == cut.output_ids
        again = engine.generate(prompt, mode=mode, budget=16, max_new_tokens=400, eos_ids=())
        assert again.output_ids == full.output_ids
