"""The per-architecture planner (ddtree_kernels/arch.py): which row a device gets, and the tiles tree
attention then launches. That each row's tiles fit its family is tests/kernels/test_aot.py."""

from __future__ import annotations

import pytest
import torch

from ddtree_kernels.arch import ROWS, arch_row, device_row
from ddtree_kernels.tree_attention import AttentionConfig, _default_config, _plan

H200, RTX_PRO_6000 = 232448, 101376  # shared_memory_per_block_optin as the devices report it


@pytest.mark.parametrize(
    ("capability", "smem", "family"),
    [
        ((9, 0), H200, "sm_90"),
        ((10, 0), H200, "sm_100"),  # B200
        ((10, 3), H200, "sm_100"),  # B300: same family
        ((12, 0), RTX_PRO_6000, "sm_120"),
        ((12, 1), RTX_PRO_6000, "sm_120"),  # GB10
        ((8, 9), RTX_PRO_6000, "generic"),  # Ada
        ((8, 0), 167936, "generic"),  # A100
        ((9, 0), RTX_PRO_6000, "generic"),  # a part of a family that allows less than its row assumes
    ],
)
def test_the_row_follows_capability_and_shared_memory(capability, smem, family) -> None:
    assert arch_row(capability, smem).family == family


def test_a_device_below_every_row_is_refused_with_the_fix() -> None:
    with pytest.raises(
        RuntimeError, match=r"sm_75 allows 65536 bytes .* less than the 101376 .*\(fix: add a row"
    ):
        arch_row((7, 5), 65536)


def test_rows_never_promise_more_than_their_family_allows() -> None:
    assert ROWS["sm_90"].smem_per_block == ROWS["sm_100"].smem_per_block == 227 * 1024
    assert ROWS["sm_120"].smem_per_block == ROWS["generic"].smem_per_block == RTX_PRO_6000
    assert device_row(torch.device("cpu")) is ROWS["sm_90"]  # the interpreter runs the tuned row


def test_tree_attention_takes_its_tiles_from_the_row() -> None:
    """On sm_120 a 257-node tree (1028 packed rows) gets 64x32 tiles that fit 99 KB without spills, and its tail the 16-row tiles."""
    row = ROWS["sm_120"]
    assert _default_config(4, row) == AttentionConfig(16, 64, 4, 3)
    assert _default_config(68, row) == AttentionConfig(64, 64, 8, 3)
    cfg = _default_config(1028, row)
    assert cfg == AttentionConfig(64, 32, 8, 3)
    launches = _plan(1028, 4, 4096 + 257, 8, cfg, 188, AttentionConfig(*row.tail))
    assert {launch.config for launch in launches} <= {cfg, AttentionConfig(*row.tail)}
    assert _default_config(1028, ROWS["sm_90"]) == AttentionConfig(64, 128, 4, 3)
