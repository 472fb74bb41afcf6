"""The C allocator's settings for decoding on the CPU.

Every round allocates the same activation tensors again (tens of KiB to a few MiB: gathered K/V,
logits, tree rows). With glibc's defaults the larger ones are fresh `mmap`s and freed memory at the
top of the heap goes back to the OS, so each round faults its pages in again, zeroed by the kernel:
on the demo pair a batched tree round of 16 sequences spent a third of its time there (31-39 ms a
round against 22-25 with the settings below; benchmarks/RESULTS.md). Keeping freed memory in the
heap makes the next round reuse resident pages, as jemalloc or tcmalloc would (what CPU serving
guides preload), without a library to install.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD = -1  # mallopt's parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's ceiling on 64-bit: larger blocks (weights, caches) still map
TRIM_THRESHOLD = 512 << 20  # free memory kept at the heap's top before any goes back


def keep_freed_memory() -> bool:
    """Serve allocations below 32 MiB from the heap and keep up to 512 MiB of freed memory there.
    Process-wide, for allocations made after the call; False where the C library is not glibc
    (nothing changes there)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
