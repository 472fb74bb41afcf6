"""The CPU allocator settings: a round's activations come from the heap and stay there when freed."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import ctypes, sys, torch
from ddtree_runtime.host_memory import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
        "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
rows = torch.ones(4 << 20)  # 16 MiB, as a round's larger activations
mapped = libc.mallinfo2().hblkhd >> 20
del rows
print(mapped, libc.mallinfo2().fordblks >> 20)  # MiB in mmapped blocks while live; free in the heap after
"""


def allocator(mode: str) -> tuple[int, int]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True)
    mapped, heap_free = out.stdout.split()[-2:]
    return int(mapped), int(heap_free)


def test_a_rounds_activations_come_from_the_heap_and_stay_there() -> None:
    mapped, _ = allocator("default")
    assert mapped >= 16  # glibc's default: a fresh mmap, unmapped on free, faulted in again next time
    mapped, heap_free = allocator("keep")
    assert mapped < 16
    assert heap_free >= 16
