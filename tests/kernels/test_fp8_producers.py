"""The kernels that quantize the activations they produce for an FP8 target's linears (RMSNorm and
SwiGLU's gate) against their references: the unfused kernel's output quantized by
`act_quant_reference`, bit for bit, in both scale layouts (per 128-column group, per row); and the
FP8 matmuls given those quantized rows compute what they compute from the rows themselves."""

from __future__ import annotations

import pytest
import torch

from ddtree_kernels.fp8_gemm import GemmConfig, fp8_gemm
from ddtree_kernels.fp8_skinny import fp8_skinny
from ddtree_kernels.host import QuantizedRows
from ddtree_kernels.rms_norm import rms_norm, rms_norm_fp8
from ddtree_kernels.silu_mul import silu_mul, silu_mul_fp8
from ddtree_runtime.fp8 import act_quant_reference, fp8_linear_reference, quantize_weight
from tests.kernels.trees import DEVICE


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit (e4m3 and -0.0 included)."""
    a, b = a.cpu(), b.cpu()
    if a.dtype == torch.float8_e4m3fn:
        a, b = a.view(torch.uint8), b.view(torch.uint8)
    return a.dtype == b.dtype and torch.equal(a, b)


def _assert_quantized_as_reference(rows: QuantizedRows, produced: torch.Tensor, group: int) -> None:
    want_q, want_s = act_quant_reference(produced.cpu(), group)
    assert rows.dtype == produced.dtype and rows.group == group
    assert _same(rows.scale, want_s) and _same(rows.x8, want_q)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("rows", "hidden", "residual", "scale_fp32", "group"),
    [
        (1, 384, False, False, 128),
        (5, 300, True, False, 128),
        (3, 96, True, True, 32),
        (4, 200, True, True, 200),
    ],
)
def test_rms_norm_fp8(dtype, rows, hidden, residual, scale_fp32, group) -> None:
    """Qwen3's weights in the model dtype and Qwen3.5's fp32 (1 + w) scales; ragged last groups and a
    per-row scale (group >= H)."""
    gen = torch.Generator().manual_seed(rows + hidden)
    x = (torch.randn(rows, hidden, generator=gen) * 3).to(DEVICE, dtype)
    r = torch.randn(rows, hidden, generator=gen).to(DEVICE, dtype) if residual else None
    w = (1 + 0.1 * torch.randn(hidden, generator=gen)).to(DEVICE, torch.float32 if scale_fp32 else dtype)
    out, s, quantized = rms_norm_fp8(x, w, 1e-6, r, group)
    want_out, want_s = rms_norm(x, w, 1e-6, r)
    assert _same(out, want_out) and _same(s, want_s)
    _assert_quantized_as_reference(quantized, out, group)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("t", "inner", "group"), [(1, 2048, 128), (3, 300, 128), (2, 1100, 1100), (2, 200, 200)]
)
def test_silu_mul_fp8(dtype, t, inner, group) -> None:
    """Groups inside a program's block (ragged at the row's end) and one scale per row, whole in a
    block or walked in steps (I > 1024)."""
    gen = torch.Generator().manual_seed(t + inner)
    gate_up = (torch.randn(t, 2 * inner, generator=gen) * 2).to(DEVICE, dtype)
    quantized = silu_mul_fp8(gate_up, group)
    _assert_quantized_as_reference(quantized, silu_mul(gate_up), group)


def test_silu_mul_fp8_refuses_groups_across_its_blocks() -> None:
    with pytest.raises(RuntimeError, match="not 384"):
        silu_mul_fp8(torch.zeros(1, 4096, device=DEVICE), 384)


@pytest.mark.parametrize(("t", "block"), [(3, (128, 128)), (20, (128, 128)), (2, (1, 256)), (20, (1, 256))])
def test_the_fp8_linears_read_quantized_rows_as_they_quantize_rows(t, block) -> None:
    gen = torch.Generator().manual_seed(t)
    k, n = 256, 96
    x = (torch.randn(t, k, generator=gen) * 2).to(DEVICE)
    weight, scale = quantize_weight(torch.randn(n, k, generator=gen) * k**-0.5, block)
    weight, scale = weight.to(DEVICE), scale.to(DEVICE)
    group = min(block[1], k)
    rows = QuantizedRows(*act_quant_reference(x.cpu(), group), group, x.dtype)
    rows = QuantizedRows(rows.x8.to(DEVICE), rows.scale.to(DEVICE), group, x.dtype)
    run = (
        (lambda a: fp8_skinny(a, weight, scale, block))
        if t <= 16
        else (lambda a: fp8_gemm(a, weight, scale, block, GemmConfig(32, 64, 4, 2)))
    )
    assert _same(run(rows), run(x))
    assert _same(
        fp8_linear_reference(rows, weight.cpu(), scale.cpu(), block),
        fp8_linear_reference(x.cpu(), weight.cpu(), scale.cpu(), block),
    )
    other = QuantizedRows(*act_quant_reference(x.cpu(), 64), 64, x.dtype)
    with pytest.raises(RuntimeError, match="groups of 64"):
        fp8_linear_reference(other, weight.cpu(), scale.cpu(), block if block[0] == 1 else (128, 128))
