"""Every kernel compiled for sm_90, sm_100 and sm_120 on this CPU machine (ddtree_kernels/aot.py compiles
the launches of ddtree_kernels/aot_specs.py): each config the planner (ddtree_kernels/arch.py) can choose fits its
family's shared memory without spills, each architecture gets its own matrix instructions,
ddtree_kernels/ARCH.md lists what is compiled, and ``--loops`` shows what a kernel's loops issue.

A cold run compiles ~60 launches (about a minute on 2 cores); Triton's cache makes reruns quick.
"""

from __future__ import annotations

import re

import pytest
import triton

from ddtree_kernels import aot, aot_specs
from ddtree_kernels.arch import ROWS, WIDE_ROWS


@pytest.fixture(scope="module")
def compiled() -> dict[str, aot.Compiled]:
    return aot.compile_all()


def test_every_row_choice_is_compiled_on_every_target_of_its_row() -> None:
    tiles = {
        (s.row, s.cc, " ".join(s.case.split()[-3:]))
        for s in aot_specs.specs().values()
        if s.kernel == "tree_attention"
    }
    for row in (*ROWS.values(), *WIDE_ROWS.values()):
        for cc in row.targets:
            for t in (row.decode, row.small, row.large, row.tail):
                assert (row.family, cc, f"{t.block_m}x{t.block_n} w{t.num_warps} s{t.num_stages}") in tiles, (
                    row,
                    cc,
                    t,
                )
    others = {(s.kernel, s.cc) for s in aot_specs.specs().values() if s.kernel != "tree_attention"}
    assert {cc for _, cc in others} == set(aot.TARGETS) == {90, 100, 120}
    assert {k for k, _ in others} >= {
        "merge_splits",
        "tree_visibility",
        "marginal_topk.partials",
        "tree_build.tree",
        "tree_walk.choice",
        "tree_walk.walk",
        "kv_compact",
    }


@pytest.mark.slow
def test_every_launch_fits_its_shared_memory_and_nothing_spills(compiled) -> None:
    found = [p for key, spec in aot_specs.specs().items() for p in aot.problems(spec, compiled[key])]
    assert not found, "\n".join(found)
    if aot._cuobjdump() is not None:
        gone = [key for key in aot.ACCEPTED_SPILLS if not compiled[key].spill_ops]
        assert not gone, f"no longer spill, remove from ddtree_kernels.aot.ACCEPTED_SPILLS: {gone}"
    # the check has teeth: the H200's big-tree tiles do not fit an sm_120 block
    big = next(s for s in aot_specs.specs().values() if s.row == "sm_90" and "main 64x128" in s.case)
    assert compiled[big.key].shared > ROWS["sm_120"].smem_per_block


@pytest.mark.slow
@pytest.mark.skipif(aot._cuobjdump() is None, reason="this Triton wheel ships no cuobjdump")
def test_each_architecture_gets_its_matrix_instructions(compiled) -> None:
    """wgmma on sm_90, tcgen05 (UTCHMMA) on sm_100, warp-level mma.sync (HMMA) on sm_120 for the big-tree tiles."""

    def matrix(row: str, cc: int) -> dict[str, int]:
        spec = next(s for s in aot_specs.specs().values() if s.row == row and s.cc == cc and "main" in s.case)
        return compiled[spec.key].matrix

    assert set(matrix("sm_90", 90)) == {"HGMMA"}
    assert set(matrix("sm_100", 100)) == {"UTCHMMA"}
    assert set(matrix("sm_120", 120)) == {"HMMA"}


@pytest.mark.slow
def test_the_committed_table_is_current(compiled) -> None:
    """ARCH.md lists every compiled launch; made by this Triton, its figures match too (else: --write)."""
    text = aot.ARCH_MD.read_text()
    for spec in aot_specs.specs().values():
        assert f"| {spec.kernel} | {spec.case} | {spec.row} | sm_{spec.cc} |" in text, (
            f"{spec.key} is missing from ddtree_kernels/ARCH.md (fix: python -m ddtree_kernels.aot --write)"
        )
    made_by = re.search(r"with Triton (\S+) for", text).group(1)
    if made_by == triton.__version__:
        assert text == aot.table(compiled), (
            "ddtree_kernels/ARCH.md is stale (fix: python -m ddtree_kernels.aot --write)"
        )


def _fp8_gemm_key(target: str = "sm_90") -> str:
    return next(k for k in aot_specs.specs() if k.startswith("fp8_gemm | T=65") and k.endswith(f"| {target}"))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("target", "matrix", "per_loop"), [("sm_90", "QGMMA", [4, 0]), ("sm_120", "QMMA", [32, 0])]
)
def test_loops_show_what_one_trip_of_a_kernel_loop_issues(
    target: str, matrix: str, per_loop: list[int]
) -> None:
    """The FP8 GEMM's K loop issues one 128-wide K step of FP8 products (four 64x128x32 wgmma on sm_90,
    32 mma.sync on sm_120, whose back edge is a uniform-predicate BRA.U), and the last split's sum of the
    partials is a loop of its own; the out-of-line barrier waits are not loops."""
    (sass,) = aot.specs_sass([_fp8_gemm_key(target)])
    found = aot.loops(sass)
    assert [loop.opcodes[matrix] for loop in found] == per_loop
    assert all(loop.start < loop.end and loop.opcodes["BRA"] >= 1 for loop in found)
    assert f"{matrix} {per_loop[0]}" in found[0].summary()


@pytest.mark.slow
def test_the_loops_command_names_each_spec_and_refuses_a_key_it_does_not_know(capsys) -> None:
    key = _fp8_gemm_key()
    assert aot.main(["--loops", key]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == key and len(out) == 3 and all(line.startswith("  0x") for line in out[1:])
    assert aot.main(["--loops", "no such kernel"]) == 1
    assert "no spec key contains 'no such kernel'" in capsys.readouterr().out
