"""Programmatic dependent launch (PDL, Hopper and newer): a linear starts streaming its weight
while the small kernel before it still runs.

An `ar` step is a chain of skinny linears and the small kernels between them (norms, SwiGLU, the
DeltaNet step, attention), each waiting for the one before. A linear's time is its weight bytes at
bandwidth plus a fixed cost (~7 µs graphed alone on the H100 and the H200 alike, ~4.6-6.3 µs in a
chain: launch, the first loads' latency, the last wave): ~1.5 ms of a 27B FP8 step's 256 linears
(benchmarks/RESULTS.md). The weight does not depend on the kernel before, so with PDL

- a small kernel that feeds a linear releases its dependents as it starts (``release_dependents``),
- the linear is launched with ``launch_pdl`` (``launch_options``): its programs start then, warm the
  L2 with the first steps of their weight slice and wait for the producer to finish and flush before
  reading anything it wrote (``prefetch_then_wait``);
- the linear releases its own dependents only after its K loop (releasing at its start let the
  next kernels' waiting programs crowd the SMs: 1.16-1.28x slower in a probe).

Only the decode-row linears (``skinny_matmul``, ``fp8_skinny``) do this: the tree rows' ``fp8_gemm``
launched the same way made the B=64 ddtree rounds 6-8% slower on an H100, so it stays plain.

The other way round on tree rows: there the linears (``fp8_gemm``, cuBLAS) are launched plainly and
the small kernels between them (norms, SwiGLU, rope, attention and its merge, the DeltaNet inputs,
the activation quantizer) are launched with PDL and wait at their start (``seam_launch_options``),
so each launch overlaps the drain of the kernel before: the ddtree B=64 rounds 1.1-1.7% faster on an
H100. Over decode rows, between PDL linears, the same made the 8B FP8 `ar` step ~1.5% slower, so
there they stay plain.

Every kernel launched with ``launch_pdl`` waits before it touches memory another kernel writes,
so the stream order holds; a kernel launched plainly waits for everything before it as always.
Off on the CPU interpreter and before sm_90 (no ``griddepcontrol``), and with ``SPECOPS_PDL=0``.
"""

from __future__ import annotations

import os
from functools import cache

import torch
import triton
import triton.language as tl

from ddtree_kernels.host import MAX_ROWS

try:  # Triton >= 3.4
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - older Triton: PDL stays off
    gdc_launch_dependents = gdc_wait = None

PREFETCH_STEPS = tl.constexpr(2)  # K steps of each program's weight slice warmed in L2 before the wait


@cache
def _hopper_or_newer(device: torch.device) -> bool:
    return torch.cuda.get_device_capability(device) >= (9, 0)


def enabled(device: torch.device) -> bool:
    """Whether kernels on ``device`` use PDL (compiled in: a constexpr of each kernel)."""
    return (
        device.type == "cuda"
        and gdc_wait is not None
        and os.environ.get("SPECOPS_PDL", "1") != "0"
        and _hopper_or_newer(device)
    )


def launch_options(device: torch.device) -> dict[str, bool]:
    """The launch keywords of a kernel that waits for its producer (``prefetch_then_wait``)."""
    return {"launch_pdl": True} if enabled(device) else {}


def seam_launch_options(device: torch.device, rows: int) -> dict[str, bool]:
    """The launch keywords of a small kernel between the linears, which waits for its producer at
    its start: PDL over more than ``MAX_ROWS`` rows (tree verify, prefill), plain over decode rows."""
    return launch_options(device) if rows > MAX_ROWS else {}


@triton.jit
def release_dependents(PDL: tl.constexpr):
    """Let the next kernel in the stream launch now (it still waits for this one's results)."""
    if PDL:
        gdc_launch_dependents()


@triton.jit
def release_then_wait(PDL: tl.constexpr):
    """A small kernel's start under PDL: let the next kernel launch, then wait for the one before."""
    release_dependents(PDL)
    wait_for_producer(PDL)


@triton.jit
def wait_for_producer(PDL: tl.constexpr):
    """Under PDL: wait until the kernel before has finished and its writes are visible."""
    if PDL:
        gdc_wait()


@triton.jit
def prefetch_then_wait(PDL: tl.constexpr, W, rows, n_rows, stride, k0, k_total, BLOCK_K: tl.constexpr):
    """Under PDL: warm the L2 with the first ``PREFETCH_STEPS`` K steps from ``k0`` of a row-major
    weight's ``rows`` (one prefetch per 128 bytes, addresses past the ends clamped onto the weight)
    while the kernel before still runs, then wait until it has finished and its writes are visible."""
    if PDL:
        line: tl.constexpr = 1024 // W.dtype.element_ty.primitive_bitwidth
        lines = k0 + tl.arange(0, PREFETCH_STEPS * BLOCK_K // line) * line
        ptrs = W + tl.minimum(rows, n_rows - 1)[:, None] * stride + tl.minimum(lines, k_total - 1)[None, :]
        tl.inline_asm_elementwise(
            "prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1
        )
        gdc_wait()
