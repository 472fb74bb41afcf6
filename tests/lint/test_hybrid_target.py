"""Every rule against a qwen3_5 (Qwen3.5/3.6 hybrid) target: layer counts and rope from
`text_config`, the mask token inside the target's vocabulary, one faulty case per code."""

from __future__ import annotations

import pytest

from drafter_config import CODES
from tests.lint import corpus
from tests.lint.corpus import DELETE, mutated
from tests.lint.helpers import by_code, lint_case

Q36 = corpus.qwen36_drafter()  # 16 target layers, [S, S, S, S, F], mask 248070
T35 = corpus.qwen35_target()  # text_config: 16 layers (3 linear + 1 full), vocab 248320, eos 248044


def _without(name: str):
    tensors = corpus.drafter_tensors(Q36)
    del tensors[name]
    return tensors


CASES = [
    ("not-dflash", {"drafter": mutated(Q36, architectures=["Qwen3ForCausalLM"])}, "DFL002"),
    ("mask-missing", {"drafter": mutated(Q36, dflash_config__mask_token_id=DELETE)}, "DFL010"),
    ("mask-at-vocab-end", {"drafter": mutated(Q36, dflash_config__mask_token_id=248320)}, "DFL011"),
    (
        "mask-spec",
        {"drafter": mutated(Q36, dflash_config__mask_token_id=248071), "spec": {"mask_token_id": 248070}},
        "DFL011",
    ),
    ("mask-is-eos", {"drafter": mutated(Q36, dflash_config__mask_token_id=corpus.QWEN35_EOS)}, "DFL012"),
    ("ids-missing", {"drafter": mutated(Q36, dflash_config__target_layer_ids=DELETE)}, "DFL020"),
    ("ids-unsorted", {"drafter": mutated(Q36, dflash_config__target_layer_ids=[1, 12, 4, 8, 10])}, "DFL021"),
    ("ids-beyond", {"drafter": mutated(Q36, dflash_config__target_layer_ids=[1, 4, 7, 10, 16])}, "DFL022"),
    ("num-target-layers", {"drafter": mutated(Q36, num_target_layers=64)}, "DFL023"),
    ("ids-vs-fc", {"drafter": mutated(Q36, dflash_config__target_layer_ids=[1, 4, 7, 10])}, "DFL024"),
    ("ids-spec-shift", {"spec": {"target_layer_ids": [i - 1 for i in corpus.default_ids(16, 5)]}}, "DFL025"),
    ("types-length", {"drafter": mutated(Q36, layer_types=["sliding_attention"] * 4)}, "DFL030"),
    (
        "types-linear",
        {"drafter": mutated(Q36, layer_types=["linear_attention"] * 4 + ["full_attention"])},
        "DFL031",
    ),
    ("sliding-no-window", {"drafter": mutated(Q36, sliding_window=None)}, "DFL032"),
    ("window-unused", {"drafter": mutated(Q36, layer_types=["full_attention"] * 5)}, "DFL033"),
    ("window-below-block", {"drafter": mutated(Q36, sliding_window=8)}, "DFL034"),
    ("hidden-size", {"target": corpus.qwen35_target(hidden=128)}, "DFL040"),
    ("vocab-size", {"target": mutated(T35, text_config__vocab_size=151936)}, "DFL041"),
    ("kv-heads-vs-weights", {"drafter": mutated(Q36, num_key_value_heads=4)}, "DFL042"),
    ("rope-theta", {"drafter": mutated(Q36, rope_theta=1000000)}, "DFL043"),
    ("rms-eps", {"drafter": mutated(Q36, rms_norm_eps=1e-5)}, "DFL044"),
    ("max-position", {"drafter": mutated(Q36, max_position_embeddings=40960)}, "DFL045"),
    (
        "target-fp8-e5m2",
        {"target": mutated(T35, quantization_config={"quant_method": "fp8", "fmt": "e5m2"})},
        "DFL046",
    ),
    ("block-missing", {"drafter": mutated(Q36, block_size=DELETE)}, "DFL050"),
    (
        "serve-tokens",
        {"serve": "serve:\n  mode: dflash\n  speculative_config:\n    num_speculative_tokens: 7\n"},
        "DFL051",
    ),
    ("dtype", {"drafter": mutated(Q36, dtype="bfloat16")}, "DFL060"),
    ("weight-missing", {"tensors": _without("layers.4.mlp.down_proj.weight")}, "DFL061"),
]


@pytest.mark.parametrize(("kwargs", "code"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_faulty_case_against_a_hybrid_target(tmp_path, kwargs, code):
    kwargs = {"drafter": Q36, "target": T35, "tokenizer": False, **kwargs}
    report = lint_case(tmp_path, **kwargs)
    found = by_code(report, code)
    assert found, f"{code} not in {report.codes()}"
    assert found[0].message and found[0].hint


def test_every_code_has_a_hybrid_case():
    # DFL062 and DFL063 are about hostile files, whatever the target: tests/lint/test_hostile.py
    assert {c[2] for c in CASES} | {"DFL001", "DFL062", "DFL063"} == set(CODES)


def test_the_good_hybrid_pair_is_clean(tmp_path):
    assert lint_case(tmp_path, Q36, target=T35, tokenizer=False).findings == []


def test_counts_and_vocab_come_from_text_config(tmp_path):
    """A one-based id list ends at the text_config's layer count; the mask must sit inside the
    text_config's vocabulary, and the messages cite the text_config lines."""
    report = lint_case(
        tmp_path,
        mutated(Q36, dflash_config__mask_token_id=248320, dflash_config__target_layer_ids=[2, 5, 8, 11, 16]),
        target=T35,
        tokenizer=False,
    )
    (mask,) = by_code(report, "DFL011")
    assert "248320" in mask.message and "vocab_size" in mask.message
    (beyond,) = [f for f in by_code(report, "DFL022") if f.severity == "error"]
    assert "16" in beyond.message
