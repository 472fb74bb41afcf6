"""Launch limits per GPU architecture family: which attention tiles and pipeline stages fit.

Shared memory per block is the constraint that differs most between the families we target: an
sm_90 (H100/H200) or sm_100 (B200/B300) block may opt in to 227 KB, an sm_120 part (RTX PRO 6000,
RTX 5090, GB10) to 99 KB. The tree-attention tiles tuned on the H200 (128 x 64 keys, 4 stages: 165
KB) would fail at the first launch on sm_120. Each family therefore gets a row of launch choices
whose every config is compiled ahead of time for that family's architecture and checked to fit
``smem_per_block`` without register spills (``ddtree_kernels/aot.py``, ``tests/kernels/test_aot.py``;
figures in ``ddtree_kernels/ARCH.md``). ``ROWS`` hold for head_dim <= 128 in a 2-byte dtype; ``WIDE_ROWS``
for head_dim <= 256 (the gated full-attention layers of Qwen3.5/3.6), whose K and V tiles are twice
as large.

The planner picks the device's family by compute capability and keeps it only if the device's
``shared_memory_per_block_optin`` reaches the row's limit; otherwise it falls back to the generic
row, the configs that fit 99 KB, and refuses a device below even that.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

import torch


class Tiles(NamedTuple):
    """One attention launch shape: query-row tile, key tile, warps, software-pipeline stages."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


@dataclass(frozen=True)
class ArchRow:
    """Launch choices of one architecture family, all checked to fit ``smem_per_block`` bytes.

    ``decode``: <= 16 packed query rows; ``small``: <= 256; ``large``: more; ``tail``: the separate
    launch for the rows past the last ``small`` or ``large`` tile. ``targets``: the capabilities
    (major * 10 + minor) the ahead-of-time test compiles the row for.
    """

    family: str
    smem_per_block: int
    decode: Tiles
    small: Tiles
    large: Tiles
    tail: Tiles
    targets: tuple[int, ...]

    def describe(self) -> str:
        """One line for logs and the provision smoke step: the family and its tile choices."""
        tiles = ", ".join(
            f"{name} {t.block_m}x{t.block_n} w{t.num_warps} s{t.num_stages}"
            for name, t in (
                ("decode", self.decode),
                ("small", self.small),
                ("large", self.large),
                ("tail", self.tail),
            )
        )
        return f"{self.family} row (<= {self.smem_per_block} B shared/block): {tiles}"


KB = 1024
# Opt-in shared memory per block (cudaDevAttrMaxSharedMemoryPerBlockOptin), CUDA programming guide,
# "Technical specifications per compute capability": 227 KB on 9.0 and 10.x, 99 KB on 8.6, 8.9, 12.x.
SMEM_SM90 = 227 * KB
SMEM_SM100 = 227 * KB
SMEM_SM120 = 99 * KB

# H200-tuned (benchmarks/RESULTS.md): wgmma tiles. Trees take 64-row tiles on one warpgroup with
# 128-key steps: against 128 x 64 on 8 warps (4 stages) and 64 x 64 they pad a 2^k + 1 tree's packed
# rows less and halve the online-softmax steps (Qwen3-8B, µs a layer: 17 nodes at 32K 59.4 -> 49.9,
# 65 nodes at 32K 120.5 -> 112.7, 257 nodes at 4K 82.4 -> 61.1; 65 nodes at 4K 30.9 -> 31.9).
_HOPPER = dict(
    decode=Tiles(16, 128, 4, 3),
    small=Tiles(64, 128, 4, 3),
    large=Tiles(64, 128, 4, 3),
    tail=Tiles(16, 128, 4, 3),
)
# 99 KB: K+V of a 64-key tile at head_dim 128 is 32 KB a stage. Without wgmma the accumulator and Q
# live in registers, and 128-row tiles spill on sm_120 even at 2 stages, so big trees use 64-row
# tiles on 8 warps; since the kernel reads the context length on the device (CUDA graphs), 64-key
# tiles spill there too at 257 nodes, so trees take 32-key tiles; decode keeps 3 stages by halving
# the key tile.
_SMALL_SMEM = dict(
    decode=Tiles(16, 64, 4, 3),
    small=Tiles(64, 64, 8, 3),
    large=Tiles(64, 32, 8, 3),
    tail=Tiles(16, 64, 4, 3),
)

ROWS: dict[str, ArchRow] = {
    "sm_90": ArchRow("sm_90", SMEM_SM90, targets=(90,), **_HOPPER),
    # untuned on hardware: the Hopper tiles compile to tcgen05 (UTCHMMA); for the big trees a 64-key
    # tile spills registers at 1025 nodes (Triton 3.9), a 32-key tile does not; decode on 128-key
    # tiles spills once the context length is read on the device, 64-key tiles do not
    "sm_100": ArchRow(
        "sm_100",
        SMEM_SM100,
        targets=(100,),
        **{
            **_HOPPER,
            "decode": Tiles(16, 64, 4, 3),
            "small": Tiles(64, 64, 4, 3),
            "large": Tiles(128, 32, 8, 4),
        },
    ),
    "sm_120": ArchRow("sm_120", SMEM_SM120, targets=(120,), **_SMALL_SMEM),
    # any other family (Ampere/Ada at 99-163 KB, future parts): the configs that fit 99 KB; trees
    # on 32-key tiles, which do not spill on sm_80 (mma.sync, no TMA) where 64-key tiles do
    "generic": ArchRow(
        "generic",
        SMEM_SM120,
        targets=(80, 120),
        **{**_SMALL_SMEM, "small": Tiles(64, 32, 8, 3), "large": Tiles(64, 32, 8, 3)},
    ),
}
# head_dim 256: K+V of a 64-key tile is 64 KB a stage. Compiled for sm_90: 128x64 tiles need two
# stages (198 KB); 128x32 at three fit in 166 KB (it spills on sm_100, where big trees take 64x64 on
# two stages). On sm_120 64x32 tiles on 8 warps, 2 stages (70 KB), fit 99 KB without spilling (on 4
# warps they spill at 1025 nodes); decode keeps 3 stages on 32-key tiles. Pre-Hopper parts (sm_80,
# mma.sync with no TMA) spilled at every tile tried, so the generic wide row is checked on sm_120 only.
# Small trees on sm_90 take 64 x 32 on one warpgroup, 4 stages (Qwen3.6-27B, 17 nodes, µs a layer:
# 23.6 -> 16.6 at 4K, 94.4 -> 53.7 at 32K, against 64 x 64 on 8 warps at 2 stages).
_HOPPER_D256 = dict(
    decode=Tiles(16, 64, 4, 3),
    small=Tiles(64, 32, 4, 4),
    large=Tiles(128, 32, 8, 3),
    tail=Tiles(16, 64, 4, 3),
)
_SMALL_SMEM_D256 = dict(
    decode=Tiles(16, 32, 4, 3),
    small=Tiles(64, 32, 8, 2),
    large=Tiles(64, 32, 8, 2),
    tail=Tiles(16, 32, 4, 3),
)
WIDE_ROWS: dict[str, ArchRow] = {
    "sm_90": ArchRow("sm_90/d256", SMEM_SM90, targets=(90,), **_HOPPER_D256),
    "sm_100": ArchRow(
        "sm_100/d256",
        SMEM_SM100,
        targets=(100,),
        **{**_HOPPER_D256, "small": Tiles(64, 64, 8, 2), "large": Tiles(64, 64, 8, 2)},
    ),
    "sm_120": ArchRow("sm_120/d256", SMEM_SM120, targets=(120,), **_SMALL_SMEM_D256),
    "generic": ArchRow("generic/d256", SMEM_SM120, targets=(120,), **_SMALL_SMEM_D256),
}
_FAMILIES = {9: "sm_90", 10: "sm_100", 12: "sm_120"}


def _table(head_dim: int) -> dict[str, ArchRow]:
    if head_dim <= 128:
        return ROWS
    if head_dim <= 256:
        return WIDE_ROWS
    raise RuntimeError(
        f"tree attention has launch rows for head_dim <= 256, got {head_dim} (fix: add rows to ddtree_kernels/arch.py)"
    )


def arch_row(capability: tuple[int, int], smem_optin: int, head_dim: int = 128) -> ArchRow:
    """The row for a device of ``capability`` that allows ``smem_optin`` bytes of shared memory per
    block, for attention heads of ``head_dim``."""
    table = _table(head_dim)
    row = table[_FAMILIES.get(capability[0], "generic")]
    if smem_optin >= row.smem_per_block:
        return row
    generic = table["generic"]
    if smem_optin >= generic.smem_per_block:
        return generic
    raise RuntimeError(
        f"GPU sm_{capability[0]}{capability[1]} allows {smem_optin} bytes of shared memory per block, less than "
        f"the {generic.smem_per_block} that every tree-attention config in ddtree_kernels/arch.py needs "
        f"(fix: add a row for this family to ddtree_kernels/arch.py ROWS and check it with `python -m ddtree_kernels.aot`)"
    )


def device_row(device: torch.device, head_dim: int = 128) -> ArchRow:
    """The row for ``device`` and ``head_dim``. The CPU interpreter has no shared-memory limit: the
    sm_90 row. ``SPECOPS_ARCH_ROW=<family>`` (sm_90, sm_100, sm_120, generic) launches another
    family's row instead, on a GPU that can hold it: how `benchmarks/roofline.py` runs the RTX PRO
    6000's (sm_120) tiles on an H200 for its projection."""
    return _device_row(device, head_dim, os.environ.get("SPECOPS_ARCH_ROW"))


@lru_cache(maxsize=16)
def _device_row(device: torch.device, head_dim: int, family: str | None) -> ArchRow:
    if family is not None:
        if family not in _table(head_dim):
            raise RuntimeError(
                f"SPECOPS_ARCH_ROW={family!r} is not a family of ddtree_kernels/arch.py (fix: one of {sorted(_table(head_dim))})"
            )
        return _table(head_dim)[family]
    if device.type != "cuda":
        return _table(head_dim)["sm_90"]
    props = torch.cuda.get_device_properties(device)
    return arch_row((props.major, props.minor), props.shared_memory_per_block_optin, head_dim)


__all__ = ["ROWS", "WIDE_ROWS", "ArchRow", "Tiles", "arch_row", "device_row"]
