"""The FP8 kernels against their PyTorch reference under the interpreter: activation quantization
bit for bit, the skinny matmul and the block-scaled GEMM over both checkpoint formats (128 x 128
blocks; per-channel scales with per-row activation groups), aligned and ragged shapes, and splits."""

from __future__ import annotations

import pytest
import torch

from ddtree_kernels.fp8_cublas import cublas_takes, fp8_cublas
from ddtree_kernels.fp8_gemm import GemmConfig, act_quant, fp8_gemm
from ddtree_kernels.fp8_skinny import fp8_skinny
from ddtree_kernels.host import QuantizedRows
from ddtree_kernels.skinny_matmul import SkinnyConfig
from ddtree_runtime.fp8 import act_quant_reference, dequantize_weight, fp8_linear_reference, quantize_weight
from tests.kernels.trees import DEVICE

TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
# Hopper's FP8 wgmma (the default tiles of >= 64 rows) adds up the products of a K block with about
# 14 mantissa bits before the kernel's fp32 accumulator takes them (measured rel 1.1e-4 on an H200;
# the mma.sync path of 16- and 32-row tiles is exact in fp32); the interpreter computes in fp32
WGMMA_FP32_TOL = 5e-4 if DEVICE.type == "cuda" else TOL[torch.float32]


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double().cpu(), want.double().cpu()
    return float((got - want).norm() / want.norm())


def _operands(t: int, n: int, k: int, block: tuple[int, int], dtype: torch.dtype, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(t, k, generator=gen) * torch.rand(t, 1, generator=gen) * 4
    w = torch.randn(n, k, generator=gen) * k**-0.5 * (1 + torch.rand(n, 1, generator=gen))
    weight, scale = quantize_weight(w, block)
    return x.to(DEVICE, dtype), weight.to(DEVICE), scale.to(DEVICE)


def test_act_quant_is_the_reference_bit_for_bit() -> None:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(5, 300, generator=gen) * 30
    x[1, :128] = 0.0  # an all-zero group
    x[2, 7] = 1e4  # a group whose other values fall into e4m3's subnormals
    for group in (128, 300):
        q, s = act_quant(x.to(DEVICE), group)
        want_q, want_s = act_quant_reference(x, group)
        assert torch.equal(s.cpu(), want_s)
        assert torch.equal(q.cpu().view(torch.uint8), want_q.view(torch.uint8))


def test_quantized_weights_round_trip_within_e4m3_precision() -> None:
    w = torch.randn(200, 300, generator=torch.Generator().manual_seed(2))
    for block in ((128, 128), (1, 300)):
        weight, scale = quantize_weight(w, block)
        assert scale.shape == (-(-200 // block[0]), -(-300 // block[1]))
        assert _rel(dequantize_weight(weight, scale, block), w) < 0.04  # 3 mantissa bits


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "t, n, k, block, config",
    [
        (1, 256, 256, (128, 128), None),
        (
            5,
            200,
            384,
            (128, 128),
            SkinnyConfig(block_n=32, block_k=128, num_warps=4, num_stages=2, split_k=3),
        ),
        (16, 96, 160, (32, 32), None),
        (  # two scale groups per step, K not a multiple of the step
            4,
            64,
            384,
            (128, 128),
            SkinnyConfig(block_n=32, block_k=256, num_warps=4, num_stages=2, split_k=1),
        ),
        (3, 130, 200, (1, 200), SkinnyConfig(block_n=16, block_k=128, num_warps=4, num_stages=2, split_k=2)),
    ],
)
def test_fp8_skinny(dtype, t, n, k, block, config) -> None:
    x, weight, scale = _operands(t, n, k, block, dtype)
    out = fp8_skinny(x, weight, scale, block, config)
    want = fp8_linear_reference(x.float(), weight, scale, block)
    assert out.shape == (t, n) and out.dtype == dtype and _rel(out, want) < TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "t, n, k, block, config",
    [
        (17, 256, 256, (128, 128), GemmConfig(32, 64, 128, 4, 2)),
        # three row tiles, ragged columns, K past its end read as zeros in the last of three splits
        (70, 136, 320, (128, 128), GemmConfig(32, 64, 128, 4, 2, split_k=3)),
        (33, 130, 208, (1, 208), GemmConfig(64, 32, 128, 4, 2, split_k=2)),  # per-channel, K split
        (40, 96, 256, (32, 32), GemmConfig(64, 32, 64, 4, 2)),  # two scale groups a step
        (65, 136, 384, (128, 128), GemmConfig(64, 64, 128, 4, 2, split_k=2)),  # a 65-row tree: two row tiles
        (20, 96, 128, (32, 32), GemmConfig(16, 64, 32, 4, 2)),  # a tile across two rows of weight scales
    ],
)
def test_fp8_gemm(dtype, t, n, k, block, config) -> None:
    x, weight, scale = _operands(t, n, k, block, dtype, seed=t)
    out = fp8_gemm(x, weight, scale, block, config)
    want = fp8_linear_reference(x.float(), weight, scale, block)
    tol = WGMMA_FP32_TOL if dtype == torch.float32 and config.block_m >= 64 else TOL[dtype]
    assert out.shape == (t, n) and out.dtype == dtype and _rel(out, want) < tol


@pytest.mark.skipif(not cublas_takes(DEVICE), reason="cuBLAS's block-scaled FP8 GEMM needs a Hopper GPU")
@pytest.mark.parametrize("t", [17, 65, 257, 272])
def test_cublas_block_scaled_gemm_is_the_reference(t: int) -> None:
    """The recipe through cuBLAS, on 128 x 128 blocks with ragged last ones, from rows or from rows
    their producer quantized."""
    x, weight, scale = _operands(t, 272, 512, (128, 128), torch.bfloat16, seed=t)
    want = fp8_linear_reference(x.float(), weight, scale, (128, 128))
    out = fp8_cublas(x, weight, scale)
    assert out.shape == (t, 272) and out.dtype == torch.bfloat16 and _rel(out, want) < TOL[torch.bfloat16]
    rows = QuantizedRows(*act_quant(x, 128), 128, torch.bfloat16)
    assert torch.equal(fp8_cublas(rows, weight, scale), out)


def test_the_layout_is_checked() -> None:
    x, weight, scale = _operands(2, 64, 128, (128, 128), torch.float32)
    with pytest.raises(RuntimeError, match=r"scale \(1, 0\)"):
        fp8_gemm(x, weight, scale[:, :0], (128, 128))
    with pytest.raises(RuntimeError, match="T <= 16"):
        fp8_skinny(x.repeat(9, 1), weight, scale, (128, 128))
    x, weight, scale = _operands(20, 64, 200, (1, 200), torch.float32)
    with pytest.raises(RuntimeError, match="multiple of 16"):
        fp8_gemm(x, weight, scale, (1, 200))


def test_the_triton_backend_picks_a_kernel_by_rows_and_matches_the_torch_backend() -> None:
    from ddtree_runtime.backend import TorchBackend
    from ddtree_runtime.triton_backend import TritonBackend

    for t, block in ((3, (128, 128)), (40, (128, 128)), (2, (1, 192)), (20, (1, 192))):
        x, weight, scale = _operands(t, 96, 192, block, torch.float32, seed=t)
        out = TritonBackend.fp8_linear(x, weight, scale, block)
        assert _rel(out, TorchBackend.fp8_linear(x, weight, scale, block)) < WGMMA_FP32_TOL
