"""Every kernel compiled ahead of time for sm_90, sm_100 and sm_120, on a machine without a GPU.

``triton.compile(ASTSource(...), target=GPUTarget("cuda", cc, 32))`` runs the whole pipeline to a
cubin for any target: the compiler reports the shared memory a launch needs, and the cubin (read
with the ``cuobjdump`` in Triton's wheel) gives registers, stack, local-memory ops (spills) and the
matrix instructions. ``tests/kernels/test_aot.py`` fails when a config the planner
(``ddtree_kernels/arch.py``) can choose does not fit its family's shared memory, or spills.

This module is the machinery: a ``Spec`` (one launch), compiling it for a target and reading its
cubin, the checks and the table. What is compiled, each kernel's launch at the model's shapes, is
``ddtree_kernels/aot_specs.py``.

``python -m ddtree_kernels.aot --write`` regenerates ``ddtree_kernels/ARCH.md``; ``--loops KEY`` prints
what each loop of the matching specs' SASS issues (the instruction mix of one trip), which is how a
kernel change can be judged where no GPU is lent.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import os
import re
import subprocess
import tempfile
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import triton
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import CUDABackend
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction, native_specialize_impl

from ddtree_kernels.arch import ROWS, WIDE_ROWS

# Opt-in shared memory per block of each compiled target (the row limits of ddtree_kernels/arch.py are
# at most these); 8.0 (A100) is compiled for the generic row only.
DEVICE_SMEM = {80: 163 * 1024, 90: 227 * 1024, 100: 227 * 1024, 120: 99 * 1024}
TARGETS = (90, 100, 120)
# Register spills accepted, by Spec key, with the reason; the test fails when one is gone (remove it).
ACCEPTED_SPILLS = {
    "tree_attention | tree B=1024 N=1025 64x128 w4 s3 | sm_90 | sm_90": (
        "12 local-memory ops (24 B stack) at 255 registers with Triton 3.9, in the unsplit launch of the "
        "64x128 one-warpgroup tile (its split launches do not spill); on the H200 (Triton 3.6) that tile "
        "beat 128x64 on 8 warps at 17, 65 and 257 nodes (ddtree_kernels/arch.py), 1025 nodes unmeasured"
    ),
    "tree_attention | parts verify P=16 B=16 N=17 64x128 w4 s3 | sm_90 | sm_90": (
        "13 local-memory ops (24 B stack) at 255 registers with Triton 3.9: the batched launch's "
        "per-sequence slot, rows and length on top of the unsplit 64x128 tile; unmeasured batched"
    ),
    "tree_attention | drafter block N=16 window 2048 64x64 w8 s3 | sm_120 | sm_120": (
        "12 local-memory ops (24 B stack) with Triton 3.9: the sliding window's per-element mask in the "
        "sm_120 row's 64x64 tile; the unwindowed launch does not spill. Unmeasured on sm_120 hardware, "
        "so the row is left as it is"
    ),
    "tree_attention | parts verify P=16 B=16 N=17 64x64 w4 s3 | sm_100 | sm_100": (
        "2 local-memory ops (8 B stack) with Triton 3.9: the batched launch's per-sequence slot, rows and "
        "length on top of the single tree's 254 registers in this tile; unmeasured on sm_100 hardware"
    ),
    "tree_attention | parts drafter P=4 N=16 window 2048 64x64 w4 s3 | sm_100 | sm_100": (
        "2 local-memory ops (8 B stack) with Triton 3.9 at 168 registers (not register pressure: the "
        "compiler's stack slot for the windowed batched launch); unmeasured on sm_100 hardware"
    ),
    "tree_attention | parts verify P=16 ar N=1 16x64 w4 s3 | generic | sm_80": (
        "10 local-memory ops (24 B stack) with Triton 3.9: the generic row's decode tile is at 255 registers "
        "on sm_80 for the single sequence already; the A100 is not a target we tune for"
    ),
    "gdn_tree.solve | forest P=16 N=65 32x32 tail | - | sm_100": (
        "5 local-memory ops (16 B stack) at 128 registers with Triton 3.9, since the 16-bit A and P blocks "
        "(their loads widened to fp32 for the tf32 products); sm_90 and sm_120 do not spill, nor the single "
        "tree on sm_100; unmeasured on sm_100 hardware"
    ),
    "tree_build.tree | B=1024 | - | sm_100": (
        "3 local-memory ops (16 B stack) with Triton 3.9; CHUNK=256 instead of 512 removes them, but "
        "tree_from_topk's choice is unmeasured on hardware at B=1024, so it is left as it is"
    ),
}
ARCH_MD = Path(__file__).with_name("ARCH.md")


@dataclass(frozen=True)
class Spec:
    """One kernel launch to compile: arguments by name (sample values), constexprs and options."""

    kernel: str
    case: str
    cc: int
    fn: JITFunction
    args: dict[str, Any]
    constexprs: dict[str, Any]
    num_warps: int
    num_stages: int = 3
    row: str = "-"  # the arch row whose choice this is (attention), else "-"
    limit: int = 0  # shared-memory bytes it must fit (default: the target's)

    @property
    def key(self) -> str:
        return f"{self.kernel} | {self.case} | {self.row} | sm_{self.cc}"

    @property
    def smem_limit(self) -> int:
        return self.limit or DEVICE_SMEM[self.cc]

    def source(self) -> ASTSource:
        """The ASTSource that ``@triton.jit`` would build for these arguments."""
        signature, constexprs, attrs = {}, dict(self.constexprs), {}
        for i, name in enumerate(self.fn.arg_names):
            if name in self.constexprs:
                signature[name] = "constexpr"
                continue
            ty, key = native_specialize_impl(CUDABackend, self.args[name], False, True, True)
            if ty == "constexpr":
                signature[name], constexprs[name] = "constexpr", key
                continue
            signature[name] = ty
            if isinstance(key, str) and (attr := CUDABackend.parse_attr(key)):
                attrs[(i,)] = attr
        return ASTSource(self.fn, signature, constexprs, attrs)


@dataclass(frozen=True)
class Compiled:
    """What the compiler and the cubin say about one Spec."""

    shared: int
    registers: int | None = None
    stack: int | None = None
    spill_ops: int | None = None  # local-memory loads + stores in the SASS (Triton keeps no local arrays)
    matrix: dict[str, int] = field(default_factory=dict)  # e.g. {"HGMMA": 24}


def _specs() -> dict[str, Spec]:
    """Every spec by key, from ``ddtree_kernels/aot_specs.py`` (imported on call: it builds on this module)."""
    from ddtree_kernels import aot_specs

    return aot_specs.specs()


# --- compiling and reading the cubin -------------------------------------------------------------


def _cuobjdump() -> str | None:
    try:
        return knobs.nvidia.cuobjdump.path
    except RuntimeError:
        return None


def _cuobjdump_texts(cubin: bytes, *flags: str) -> list[str]:
    """``cuobjdump``'s output for each flag, from one temporary copy of the cubin."""
    tool = _cuobjdump()
    assert tool is not None, "callers check _cuobjdump() first"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return [
            subprocess.run([tool, flag, f.name], capture_output=True, text=True, check=True).stdout
            for flag in flags
        ]


# one SASS instruction: its address, predicate, the opcode's first part (QGMMA of QGMMA.64x128x32...)
# and its operands
_INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)([^;]*);")


def read_cubin(cubin: bytes) -> dict[str, Any]:
    """Registers, stack, spill ops and matrix-instruction counts from ``cuobjdump`` ({} without it)."""
    if _cuobjdump() is None:
        return {}
    usage, sass = _cuobjdump_texts(cubin, "-res-usage", "-sass")
    opcodes = [op for _, _, op, _ in _INSTRUCTION.findall(sass)]
    return dict(
        registers=int(re.search(r"REG:(\d+)", usage).group(1)),
        stack=int(re.search(r"STACK:(\d+)", usage).group(1)),
        spill_ops=sum(op in ("STL", "LDL") for op in opcodes),
        matrix=dict(sorted(collections.Counter(op for op in opcodes if "MMA" in op).items())),
    )


def _compile(spec: Spec) -> Any:
    with contextlib.redirect_stdout(io.StringIO()):  # TRITON_DUMP_PTXAS_LOG and friends
        return triton.compile(
            spec.source(),
            target=GPUTarget("cuda", spec.cc, 32),
            options=dict(num_warps=spec.num_warps, num_stages=spec.num_stages),
        )


def compile_spec(key: str) -> Compiled:
    """Compile one spec (by key, so that worker processes can rebuild it) and read its cubin."""
    kernel = _compile(_specs()[key])
    return Compiled(shared=kernel.metadata.shared, **read_cubin(kernel.asm["cubin"]))


@contextlib.contextmanager
def _compiler_pool(workers: int | None, jobs: int) -> Iterator[ProcessPoolExecutor]:
    """Fresh processes (by default one per core, 4 at most, none idle for ``jobs`` compiles), which
    import the kernels compiled even where this one interprets them (tests/kernels sets
    TRITON_INTERPRET=1 before our modules are imported)."""
    interpret = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "0"
    try:
        size = workers or min(4, os.cpu_count() or 1, jobs)
        with ProcessPoolExecutor(size, mp_context=get_context("spawn")) as pool:
            yield pool
    finally:
        if interpret is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = interpret


def compile_all(keys: list[str] | None = None, workers: int | None = None) -> dict[str, Compiled]:
    """Compile specs in worker processes (one per core, 4 at most); Triton's cache makes reruns quick.

    Rows that share tiles (generic and sm_120) share the compile of each identical launch.
    """
    keys = list(_specs()) if keys is None else keys
    first: dict[tuple, str] = {}
    for key in keys:
        spec = _specs()[key]
        first.setdefault((spec.kernel, spec.case, spec.cc, spec.num_warps, spec.num_stages), key)
    unique = list(first.values())
    with _compiler_pool(workers, len(unique)) as pool:
        done = dict(zip(unique, pool.map(compile_spec, unique), strict=True))
    return {
        key: done[first[(s.kernel, s.case, s.cc, s.num_warps, s.num_stages)]]
        for key, s in ((key, _specs()[key]) for key in keys)
    }


def problems(spec: Spec, result: Compiled) -> list[str]:
    """Why a compiled spec could not be launched as planned: too much shared memory, or spills."""
    found = []
    if result.shared > spec.smem_limit:
        found.append(
            f"{spec.key}: needs {result.shared} bytes of shared memory, the limit is {spec.smem_limit} "
            f"(fix: smaller tiles or fewer stages in ddtree_kernels/arch.py ROWS['{spec.row}'])"
        )
    if result.spill_ops and spec.key not in ACCEPTED_SPILLS:
        found.append(
            f"{spec.key}: {result.spill_ops} local-memory ops (register spills, {result.registers} registers, "
            f"{result.stack} B stack) (fix: more warps or smaller tiles)"
        )
    return found


# --- what a kernel's loops issue -----------------------------------------------------------------


@dataclass(frozen=True)
class Loop:
    """The instructions from a backward branch's target to the branch: one trip of a kernel loop (a
    forward branch inside it may skip part, e.g. a conditional rescale)."""

    start: int
    end: int
    opcodes: collections.Counter[str]

    def summary(self, most: int = 14) -> str:
        ops = ", ".join(f"{op} {n}" for op, n in self.opcodes.most_common(most))
        return f"{self.start:#06x}-{self.end:#06x}: {self.opcodes.total()} instructions ({ops})"


def loops(sass: str) -> list[Loop]:
    """Every loop of a kernel's SASS: a predicated branch back to an earlier instruction (nested
    loops each get their own; the outer one's counts include the inner body once). Left out: spin-
    waits on a barrier (a branch to itself or the instruction before it) and the unconditional jump
    from an out-of-line wait back into the loop that called it."""
    found = _INSTRUCTION.findall(sass)
    index = {int(address, 16): i for i, (address, _, _, _) in enumerate(found)}
    out = []
    for i, (address, predicate, op, operands) in enumerate(found):
        target = re.search(r"0x([0-9a-f]+)", operands)
        # the condition comes first (@!P0 BRA) or, from sm_100 on, as a uniform operand (BRA.U !UP0, ...)
        conditional = predicate or re.match(r"\.U\s+!?UP\w+,", operands)
        if op != "BRA" or not conditional or target is None:
            continue
        start = index.get(int(target.group(1), 16))
        if start is not None and start < i - 1:
            body = found[start : i + 1]
            out.append(
                Loop(int(body[0][0], 16), int(address, 16), collections.Counter(o for _, _, o, _ in body))
            )
    return out


def _sass_of(key: str) -> str:
    (sass,) = _cuobjdump_texts(_compile(_specs()[key]).asm["cubin"], "-sass")
    return sass


def specs_sass(keys: list[str], workers: int | None = None) -> list[str]:
    """The SASS of each spec (needs Triton's cuobjdump), compiled in one pool of fresh processes."""
    if _cuobjdump() is None:
        raise RuntimeError("reading SASS needs cuobjdump (Triton's NVIDIA backend ships one)")
    with _compiler_pool(workers, len(keys)) as pool:
        return list(pool.map(_sass_of, keys))


# --- the committed table ---------------------------------------------------------------------------


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


def table(results: dict[str, Compiled]) -> str:
    """ddtree_kernels/ARCH.md: the planner's rows, then every compiled spec."""
    from ddtree_kernels.aot_specs import BUDGET, CONTEXT, HEAD_DIM, HKV, HQ, VOCAB  # as in _specs

    lines = [
        "# Kernels per architecture (generated: `python -m ddtree_kernels.aot --write`; checked by tests/kernels/test_aot.py)",
        "",
        f'Compiled ahead of time with Triton {triton.__version__} for `GPUTarget("cuda", cc, 32)`, no GPU involved, at '
        f"Qwen3-8B shapes ({HQ}/{HKV} heads, head_dim {HEAD_DIM}, bf16, vocabulary {VOCAB}, context {CONTEXT}, "
        f"budgets up to {BUDGET}). Shared memory is the compiler's figure for one block; registers, stack, "
        "spill ops (STL/LDL in the SASS) and matrix instructions come from `cuobjdump` (Triton's copy). Figures move "
        "with the Triton version (3.6 on the H200 allocated 254 registers where 3.9 allocates 241).",
        "",
        "## The planner's rows (ddtree_kernels/arch.py)",
        "",
        "| row | targets | shared limit B | decode | small (<= 256 rows) | large | tail |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in (*ROWS.values(), *WIDE_ROWS.values()):
        tiles = [
            f"{t.block_m}x{t.block_n} w{t.num_warps} s{t.num_stages}"
            for t in (row.decode, row.small, row.large, row.tail)
        ]
        lines.append(
            f"| {row.family} | {', '.join(f'sm_{cc}' for cc in row.targets)} | {row.smem_per_block} | "
            f"{' | '.join(tiles)} |"
        )
    lines += [
        "",
        "## Every compiled launch",
        "",
        "| kernel | case | row | target | warps | stages | shared B | limit B | registers | stack B | spill ops | matrix instructions |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for key, spec in _specs().items():
        r = results[key]
        matrix = ", ".join(f"{op} x{count}" for op, count in r.matrix.items()) or "-"
        lines.append(
            f"| {spec.kernel} | {spec.case} | {spec.row} | sm_{spec.cc} | {spec.num_warps} | {spec.num_stages} | "
            f"{r.shared} | {spec.smem_limit} | {_cell(r.registers)} | {_cell(r.stack)} | {_cell(r.spill_ops)} | "
            f"{matrix} |"
        )
    lines += ["", "Spills accepted (`ACCEPTED_SPILLS` in ddtree_kernels/aot.py):", ""]
    lines += [f"- {key}: {reason}" for key, reason in ACCEPTED_SPILLS.items()]
    return "\n".join(lines) + "\n"


def print_loops(part: str, workers: int | None = None) -> int:
    """``--loops``: for each spec whose key contains ``part``, its loops' instruction mix, so that a
    kernel change can be read in the compiled code on a machine without a GPU."""
    keys = [key for key in _specs() if part in key]
    if not keys:
        print(f"no spec key contains {part!r} (see ddtree_kernels/ARCH.md for the keys)")
        return 1
    for key, sass in zip(keys, specs_sass(keys, workers), strict=True):
        print(key)
        for loop in loops(sass):
            print(f"  {loop.summary()}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Compile every kernel for sm_90/100/120 and check the planner's configs."
    )
    parser.add_argument("--write", action="store_true", help=f"write the table to {ARCH_MD}")
    parser.add_argument("--workers", type=int, help="compile processes (default: cores, 4 at most)")
    parser.add_argument(
        "--loops",
        metavar="KEY",
        help="compile only the specs whose key contains KEY and print what each loop of their SASS issues",
    )
    args = parser.parse_args(argv)
    if args.loops is not None:
        return print_loops(args.loops, args.workers)
    results = compile_all(workers=args.workers)
    text = table(results)
    if args.write:
        ARCH_MD.write_text(text)
    else:
        print(text)
    found = [p for key, spec in _specs().items() for p in problems(spec, results[key])]
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
