"""Programmatic dependent launch (ddtree_kernels/pdl.py): off where the GPU or the interpreter has
no ``griddepcontrol`` or ``SPECOPS_PDL=0`` says so; on a Hopper GPU a graphed chain of producers
and linears (decode rows, a B=64 tree's rows, where the norms and SwiGLU are the PDL-launched ones)
gives the same bits with it as without: each kernel launched so waits for its producer."""

from __future__ import annotations

import pytest
import torch

from ddtree_kernels import pdl
from ddtree_kernels.fp8_gemm import fp8_gemm
from ddtree_kernels.fp8_skinny import fp8_skinny
from ddtree_kernels.host import MAX_ROWS
from ddtree_kernels.rms_norm import rms_norm, rms_norm_fp8
from ddtree_kernels.silu_mul import silu_mul, silu_mul_fp8
from ddtree_kernels.skinny_matmul import skinny_matmul
from ddtree_runtime.fp8 import quantize_weight
from tests.kernels.trees import DEVICE

HOPPER = DEVICE.type == "cuda" and torch.cuda.get_device_capability(DEVICE) >= (9, 0)


def test_pdl_is_off_without_griddepcontrol_or_when_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    assert pdl.enabled(DEVICE) == HOPPER
    assert not pdl.enabled(torch.device("cpu"))
    # the kernels between the linears: PDL-launched over tree rows only
    assert pdl.seam_launch_options(DEVICE, 65) == ({"launch_pdl": True} if HOPPER else {})
    assert pdl.seam_launch_options(DEVICE, MAX_ROWS) == {}
    monkeypatch.setenv("SPECOPS_PDL", "0")
    assert not pdl.enabled(DEVICE)
    assert pdl.launch_options(DEVICE) == {} and pdl.seam_launch_options(DEVICE, 65) == {}


def _chain(rows: int, h: int, inner: int):
    """Layers of norm -> gate_up -> SwiGLU -> down over ``rows`` rows, FP8 then (decode rows) bf16."""
    gen = torch.Generator().manual_seed(3)

    def weight(n: int, k: int) -> torch.Tensor:
        return (torch.randn(n, k, generator=gen) / k**0.5).to(DEVICE, torch.bfloat16)

    norm = torch.rand(h, generator=gen).to(DEVICE, torch.bfloat16) + 0.5
    fp8 = [(quantize_weight(weight(2 * inner, h), (128, 128)), quantize_weight(weight(h, inner), (128, 128)))]
    bf16 = [(weight(2 * inner, h), weight(h, inner))]
    x = torch.randn(rows, h, generator=gen).to(DEVICE, torch.bfloat16)
    fp8_linear = fp8_skinny if rows <= MAX_ROWS else fp8_gemm

    def run() -> torch.Tensor:
        hidden, residual = x, x
        for gate_up, down in fp8 * 3:
            _, residual, quant = rms_norm_fp8(hidden, norm, 1e-6, residual, 128)
            hidden = fp8_linear(silu_mul_fp8(fp8_linear(quant, *gate_up, (128, 128)), 128), *down, (128, 128))
        for gate_up, down in bf16 * 3 if rows <= MAX_ROWS else []:
            normed, residual = rms_norm(hidden, norm, 1e-6, residual)
            hidden = skinny_matmul(silu_mul(skinny_matmul(normed, gate_up)), down)
        return hidden + residual

    return run


def _graphed(run) -> torch.Tensor:
    eager = run()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)
    return out


@pytest.mark.skipif(not HOPPER, reason="programmatic dependent launch needs an sm_90+ GPU")
@pytest.mark.parametrize("rows", [1, 65])
def test_a_graphed_chain_gives_the_same_bits_with_and_without_pdl(
    rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _chain(rows, 1024, 1536)
    with_pdl = _graphed(run)
    monkeypatch.setenv("SPECOPS_PDL", "0")
    assert torch.equal(_graphed(run), with_pdl)
