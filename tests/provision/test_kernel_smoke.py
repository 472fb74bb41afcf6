"""The kernel smoke test of `fab provision` (ops/gpu/remote/smoke_kernels.py) run for real on this CPU
machine: every kernel against its reference in Triton's interpreter, the skip without a GPU, a real
kernel failure reported with its fix; and the verdicts for the two GPU failures a CPU cannot raise
(no kernel image, out of resources), from their real messages."""

from __future__ import annotations

import json

import pytest
from triton.runtime.errors import OutOfResources

from ops.api.changes import StepFailed
from ops.steps.gpu import judge_kernels, smoke_script, smoke_verdict
from tests.provision.helpers import run_remote_scripts, synth

VENV = "/opt/specops/venv"


@pytest.mark.slow
def test_kernel_smoke_on_this_cpu_machine() -> None:
    script = smoke_script("kernels")
    # a row whose decode tile is below tl.dot's 16 rows: a real failure of one launch
    broken = script.replace("decode=Tiles(16, 128, 4, 3)", "decode=Tiles(8, 128, 4, 3)")
    assert broken != script
    interpreted, no_gpu, failing = run_remote_scripts(
        (script, {"TRITON_INTERPRET": "1"}),
        (script, {"TRITON_INTERPRET": "0"}),
        (broken, {"TRITON_INTERPRET": "1"}),
    )

    verdict = smoke_verdict("kernels", "hopper", *interpreted, VENV)
    assert verdict.startswith("18 kernels match their references on cpu (TRITON_INTERPRET=1) (Triton ")
    assert (
        "sm_90 row (<= 232448 B shared/block)): attention decode 16x128 w4 s3 splits 1, attention tree small "
        "64x128 w4 s3 splits 1, "
    ) in verdict
    assert "attention tree large + plain tail 64x128 w4 s3 splits 1, " in verdict  # 5 tiles of 64 rows
    assert "attention tree large + separate tail 64x128 w4 s3 splits 1 + 16x128 w4 s3 splits 1" in verdict

    assert smoke_verdict("kernels", "cpu", *no_gpu, VENV) == (
        "skipped on profile cpu: no CUDA device visible to torch "
        f"{json.loads(no_gpu[1])['torch']} (CUDA build: none, CPU-only)"
    )
    with pytest.raises(
        StepFailed, match=r"the kernels smoke test found no GPU in .*\(fix: run the torch smoke test"
    ):
        smoke_verdict("kernels", "blackwell", *no_gpu, VENV)

    with pytest.raises(StepFailed) as info:
        smoke_verdict("kernels", "hopper", *failing, VENV)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(
        "1 of 18 kernels failed on cpu (TRITON_INTERPRET=1): attention decode (8x128 w4 s3 "
    )
    assert (
        "tl.dot needs tiles of at least 16" in message and "(fix: run `TRITON_INTERPRET=0 pytest" in message
    )


def _rtx_pro_6000(error: str) -> dict:
    """The script's result on an RTX PRO 6000 where the decode launch failed with ``error``."""
    return {
        "torch": "2.14.0+cu130",
        "triton": "3.8.0",
        "device": "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
        "capability": [12, 0],
        "smem_optin": 101376,
        "row": "sm_120 row (<= 101376 B shared/block): ...",
        "kernels": [
            {"name": "attention decode", "config": "16x128 w4 s3 splits 8", "error": error},
            {"name": "kv_compact", "config": "4 rows, 2 layers", "max_error": 0.0, "tolerance": 0.0},
            {"name": "marginal_topk", "config": "k=64 of 15 x 5000", "max_error": 0.5, "tolerance": 2e-5},
        ],
    }


def test_gpu_failures_name_their_fix() -> None:
    # the exception Triton raises at launch; 139936 B is what ddtree_kernels/ARCH.md gives the H200 decode tiles on sm_120
    oor = OutOfResources(139936, 101376, "shared memory")
    with pytest.raises(StepFailed) as info:
        judge_kernels(_rtx_pro_6000(f"{type(oor).__name__}: {oor}"))
    message = str(info.value)
    assert message.startswith(
        "2 of 3 kernels failed on NVIDIA RTX PRO 6000 Blackwell Workstation Edition: "
        "attention decode (16x128 w4 s3 splits 8): OutOfResources: out of resource: shared "
        "memory, Required: 139936, Hardware limit: 101376."
    )
    assert (
        "(fix: the launch does not fit this sm_120 GPU (101376 B of shared memory per block): lower the tiles or "
        "stages of its row in ddtree_kernels/arch.py and check the row with `python -m ddtree_kernels.aot`)"
    ) in message
    assert (
        "marginal_topk (k=64 of 15 x 5000) differs from its PyTorch reference: error 0.5 > 2e-05" in message
    )

    no_image = json.loads(synth("smoke_torch_sm120_cu124.out"))["devices"][0]["error"]
    with pytest.raises(
        StepFailed,
        match=r"attention decode \(16x128 w4 s3 splits 8\): RuntimeError: CUDA error: no "
        r"kernel image .*\(fix: install a torch and Triton built for sm_120",
    ):
        judge_kernels(_rtx_pro_6000(no_image))
