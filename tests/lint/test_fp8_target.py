"""The lint against FP8 targets: the two served formats are clean, a drafter that does not fit the
quantized target is still caught, and any other quantization is a DFL046 warning naming the field
(never a crash), on configs shaped like the published ones."""

from __future__ import annotations

import pytest

from ddtree_runtime.tiny_fp8 import quantization_config
from tests.lint import corpus
from tests.lint.corpus import mutated
from tests.lint.helpers import by_code, lint_case

Q3, Q36 = corpus.qwen3_drafter(), corpus.qwen36_drafter()
T3_FP8 = mutated(corpus.qwen3_target(), quantization_config=quantization_config("block", (128, 128)))
T35_FP8 = mutated(corpus.qwen35_target(), quantization_config=quantization_config("channel", (128, 128)))


@pytest.mark.parametrize(
    ("drafter", "target"), [(Q3, T3_FP8), (Q36, T35_FP8)], ids=["qwen3-block", "qwen3_5-channel"]
)
def test_served_fp8_targets_are_clean(tmp_path, drafter, target):
    tokenizer = target is T3_FP8
    assert lint_case(tmp_path, drafter, target=target, tokenizer=tokenizer).findings == []


@pytest.mark.parametrize(
    ("drafter", "target", "code"),
    [
        (
            Q3,
            corpus.qwen3_target(hidden=128) | {"quantization_config": T3_FP8["quantization_config"]},
            "DFL040",
        ),
        (Q3, mutated(T3_FP8, vocab_size=152064), "DFL041"),
        (mutated(Q3, dflash_config__target_layer_ids=[1, 9, 17, 25, 36]), T3_FP8, "DFL022"),
    ],
    ids=["hidden", "vocab", "layer-ids"],
)
def test_a_drafter_that_does_not_fit_the_fp8_target_is_caught(tmp_path, drafter, target, code):
    report = lint_case(tmp_path, drafter, target=target)
    assert by_code(report, code) and report.errors
    assert not by_code(report, "DFL046")


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"quant_method": "gptq", "bits": 4}, "quantization_config.quant_method"),
        ({"fmt": "e5m2"}, "quantization_config.fmt"),
        ({"activation_scheme": "static"}, "quantization_config.activation_scheme"),
        ({"weight_block_size": None}, "quantization_config.weight_block_size"),
        ({"weight_block_size": [128, 48]}, "quantization_config.weight_block_size"),
    ],
)
def test_other_quantizations_are_a_warning_naming_the_field(tmp_path, change, field):
    target = mutated(T3_FP8, quantization_config={**T3_FP8["quantization_config"], **change})
    report = lint_case(tmp_path, target=target)
    (finding,) = by_code(report, "DFL046")
    assert finding.severity == "warning" and finding.path == field and finding.line is not None
    assert finding.file.endswith("config.json") and "target" in finding.file and finding.hint
    assert not report.errors


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("kv_cache_scheme",), {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False}),
        (("config_groups", "group_0", "weights", "strategy"), "tensor"),
        (("config_groups", "group_0", "input_activations"), None),
        (("format",), "pack-quantized"),
    ],
)
def test_compressed_tensors_variants_we_do_not_serve(tmp_path, path, value):
    quant = mutated(T35_FP8["quantization_config"], **{"__".join(path): value})
    report = lint_case(tmp_path, Q36, target=mutated(T35_FP8, quantization_config=quant), tokenizer=False)
    (finding,) = by_code(report, "DFL046")
    assert finding.path == ".".join(("quantization_config", *path))


def test_a_malformed_quantization_config_is_a_finding(tmp_path):
    report = lint_case(tmp_path, target=mutated(T3_FP8, quantization_config="fp8"))
    (finding,) = by_code(report, "DFL046")
    assert "not a mapping" in finding.message
