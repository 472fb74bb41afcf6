"""The decoder layer's fused steps (RMSNorm + residual, q/k norm + RoPE + cache write, SwiGLU's
gate, the skinny matmul) against their PyTorch references: the CPU runtime's `TorchBackend`."""

from __future__ import annotations

import pytest
import torch

from ddtree_kernels.qk_rope import qk_rope
from ddtree_kernels.rms_norm import rms_norm
from ddtree_kernels.silu_mul import silu_mul
from ddtree_kernels.skinny_matmul import SkinnyConfig, skinny_matmul
from ddtree_runtime.backend import TorchBackend
from ddtree_runtime.models.qwen3 import rope_tables
from tests.kernels.trees import DEVICE

# bf16: the CPU interpreter truncates each bf16 rounding (a GPU rounds to nearest)
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    assert not a.isnan().any()
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("rows", "hidden", "residual", "scale_fp32"),
    [(1, 64, False, False), (5, 96, True, False), (33, 128, True, False), (4, 80, True, True)],
)
def test_rms_norm(dtype: torch.dtype, rows: int, hidden: int, residual: bool, scale_fp32: bool) -> None:
    """Qwen3's weights in the model dtype, and Qwen3.5's (1 + w) scales in fp32."""
    gen = torch.Generator().manual_seed(rows + hidden)
    x = torch.randn(rows, hidden, generator=gen).to(DEVICE, dtype)
    r = torch.randn(rows, hidden, generator=gen).to(DEVICE, dtype) if residual else None
    w = (1 + 0.1 * torch.randn(hidden, generator=gen)).to(DEVICE, torch.float32 if scale_fp32 else dtype)
    out, s = rms_norm(x, w, 1e-6, r)
    ref_out, ref_s = TorchBackend.rms_norm(x, w, 1e-6, r)
    assert out.dtype == dtype and _rel(out, ref_out) < TOL[dtype]
    # the residual stream (the CPU interpreter truncates to bf16 where a GPU rounds)
    assert torch.equal(s, ref_s) if dtype == torch.float32 else _rel(s, ref_s) < TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("t", "hq", "hkv", "d", "ctx", "rot", "gated"),
    [
        (1, 4, 2, 16, 9, 16, False),
        (7, 6, 2, 32, 0, 32, False),
        (3, 2, 2, 24, 40, 24, False),
        (5, 4, 2, 64, 7, 16, True),  # Qwen3.5: gated query heads, a quarter of each head rotated
        (4, 0, 2, 32, 11, 32, False),  # a DFlash drafter's context rows: keys and values alone
    ],
)
def test_qk_rope_writes_the_cache_and_returns_q(
    dtype: torch.dtype, t: int, hq: int, hkv: int, d: int, ctx: int, rot: int, gated: bool
) -> None:
    gen = torch.Generator().manual_seed(t * d + ctx)
    qkv = torch.randn(t, (hq * (2 if gated else 1) + 2 * hkv) * d, generator=gen).to(DEVICE, dtype)
    w_dtype = torch.float32 if gated else dtype  # Qwen3.5's (1 + w) scales are fp32
    qw = (1 + 0.1 * torch.randn(d, generator=gen)).to(DEVICE, w_dtype)
    kw = (1 + 0.1 * torch.randn(d, generator=gen)).to(DEVICE, w_dtype)
    cos, sin = rope_tables(rot, 10000.0, 64, DEVICE)
    pos = torch.randint(0, 64, (t,), generator=gen).to(DEVICE)  # tree nodes: positions need not be rows
    length = torch.tensor(ctx, device=DEVICE)
    caches = [torch.full((hkv, 64, d), float("nan"), device=DEVICE, dtype=dtype) for _ in range(4)]
    q = qk_rope(qkv, qw, kw, 1e-6, cos, sin, pos, caches[0], caches[1], length, hq, gated=gated)
    ref = TorchBackend.qk_rope(
        qkv, qw, kw, 1e-6, cos, sin, pos, caches[2], caches[3], length, hq, gated=gated
    )
    assert q.shape == ref.shape == (t, hq, d) and (hq == 0 or _rel(q, ref) < TOL[dtype])
    rows = slice(ctx, ctx + t)
    assert _rel(caches[0][:, rows], caches[2][:, rows]) < TOL[dtype]
    assert torch.equal(caches[1][:, rows], caches[3][:, rows])  # values are copied as they are
    untouched = torch.ones(64, dtype=torch.bool)
    untouched[rows] = False
    assert caches[0][:, untouched].isnan().all() and caches[1][:, untouched].isnan().all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("t", "inner"), [(1, 96), (4, 1030)])
def test_silu_mul(dtype: torch.dtype, t: int, inner: int) -> None:
    gen = torch.Generator().manual_seed(inner)
    gate_up = (2 * torch.randn(t, 2 * inner, generator=gen)).to(DEVICE, dtype)
    assert _rel(silu_mul(gate_up), TorchBackend.silu_mul(gate_up)) < TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("t", "n", "k", "config"),
    [
        (1, 40, 96, None),
        (16, 64, 256, SkinnyConfig(16, 32, 4, 1)),
        (5, 48, 300, SkinnyConfig(32, 64, 4, 1, split_k=3)),  # ragged K over three splits
    ],
)
def test_skinny_matmul(dtype: torch.dtype, t: int, n: int, k: int, config: SkinnyConfig | None) -> None:
    gen = torch.Generator().manual_seed(n + k)
    x = torch.randn(t, k, generator=gen).to(DEVICE, dtype)
    w = (torch.randn(n, k, generator=gen) * k**-0.5).to(DEVICE, dtype)
    out = skinny_matmul(x, w, config)
    assert out.shape == (t, n) and _rel(out, TorchBackend.linear(x.float(), w.float())) < TOL[dtype]


def test_skinny_matmul_refuses_a_gemm() -> None:
    with pytest.raises(RuntimeError, match="T <= 16"):
        skinny_matmul(torch.randn(17, 32, device=DEVICE), torch.randn(8, 32, device=DEVICE))
