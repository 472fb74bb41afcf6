"""Smoke-test verdicts on real H200 outputs (and the sm_120 "no kernel image" trap), the smoke scripts
run for real on this CPU machine, and the pinned-install plan as data: facts in, command or no-op out."""

from __future__ import annotations

import pytest

from ops.api.changes import StepFailed
from ops.gpu.facts import parse_probe, probe_script
from ops.gpu.pins import check_installed, parse_requirement
from ops.steps.gpu import arch_supported, judge_smoke, smoke_script
from ops.steps.pins import plan_install
from tests.provision.helpers import h200, run_remote_scripts, synth

VENV = "/opt/specops/venv"


def test_h200_smoke_outputs_pass() -> None:
    code, out, err = h200("smoke_torch")
    assert judge_smoke("torch", code, out, err, VENV) == (
        "torch 2.11.0+cu130 (CUDA 13.0) ran a kernel on 1x NVIDIA H200 (sm_90)"
    )
    code, out, err = h200("smoke_triton")
    assert (
        judge_smoke("triton", code, out, err, VENV) == "Triton 3.6.0 compiled and ran a kernel on NVIDIA H200"
    )


def test_h200_without_vllm_fails_the_import_smoke_test() -> None:
    code, out, err = h200("import_vllm")
    with pytest.raises(StepFailed) as info:
        judge_smoke("vllm", code, out, err, VENV)
    assert str(info.value) == (
        f"`import vllm` failed in {VENV}: ModuleNotFoundError: No module named 'vllm' "
        "(fix: re-run provision with install enabled, or check the vllm pin in "
        "playbooks/pins.yaml)"
    )


def test_sm120_with_a_cu124_torch_is_the_no_kernel_image_trap() -> None:
    with pytest.raises(StepFailed) as info:
        judge_smoke("torch", 0, synth("smoke_torch_sm120_cu124.out"), "", VENV)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(
        "GPU 0 (NVIDIA RTX PRO 6000 Blackwell Workstation Edition) is sm_120 but torch "
        "2.5.1+cu124 was built for sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 sm_90: RuntimeError: "
        "CUDA error: no kernel image is available"
    )
    assert "(fix: install a torch build that includes sm_120" in message
    assert "ran a kernel on 1x NVIDIA RTX PRO 6000" in judge_smoke(
        "torch", 0, synth("smoke_torch_sm120_cu128.out"), "", VENV
    )


@pytest.mark.parametrize(
    ("cap", "arch_list", "ok"),
    [
        ((12, 0), ["sm_80", "sm_90"], False),
        ((12, 0), ["sm_90", "sm_120"], True),
        ((12, 1), ["sm_120"], True),  # same major, newer minor runs the cubin
        ((10, 0), ["sm_90", "sm_120"], False),
        ((12, 0), ["sm_80", "compute_90"], True),  # PTX is JIT-compiled for newer devices
        ((8, 9), ["sm_86"], True),
        ((9, 0), ["sm_90a"], False),  # arch-specific code is not portable
    ],
)
def test_arch_supported(cap, arch_list, ok) -> None:
    assert arch_supported(cap, arch_list) is ok


@pytest.mark.slow
def test_smoke_scripts_and_probe_for_real_on_this_cpu_machine() -> None:
    """No GPU here: torch's test fails with its fix; Triton's kernel runs in the interpreter; the probe
    reports this venv's CPU torch, which satisfies its own pin."""
    torch_run, triton_run, vllm_run, probe = run_remote_scripts(
        (smoke_script("torch"), {}),
        (smoke_script("triton"), {"TRITON_INTERPRET": "1"}),
        (smoke_script("vllm"), {}),
        (probe_script(), {}),
    )
    with pytest.raises(StepFailed, match=r"torch .* sees no GPU .*\(fix: install the CUDA build"):
        judge_smoke("torch", *torch_run, VENV)
    assert "compiled and ran a kernel on cpu (TRITON_INTERPRET=1)" in judge_smoke("triton", *triton_run, VENV)
    with pytest.raises(StepFailed, match="No module named 'vllm'"):
        judge_smoke("vllm", *vllm_run, VENV)
    env = parse_probe(probe[1])
    assert env["packages"]["torch"]["version"].startswith("2.") and env["torch"]["cuda_available"] is False
    assert (
        check_installed(parse_requirement(f"torch=={env['packages']['torch']['version']}"), env["packages"])
        is None
    )


def installed() -> dict:
    """The probe's package facts of a venv that has a cu130 torch and vLLM from a PR branch."""
    return {
        "torch": {"version": "2.14.0+cu130"},
        "triton": {"version": "3.8.0"},
        "vllm": {
            "version": "0.34.1.dev12+g0a1b2c3",
            "direct_url": {
                "url": "https://github.com/vllm-project/vllm.git",
                "vcs_info": {
                    "vcs": "git",
                    "requested_revision": "refs/pull/40898/head",
                    "commit_id": "0a1b2c3d4e5f6789",
                },
            },
        },
        "flashinfer-python": {"version": "0.7.2"},
    }


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ("torch==2.14.0", None),  # the +cu130 local label satisfies a plain pin
        ("torch==2.14.0+cu130", None),
        ("torch==2.14.0+cu128", "torch 2.14.0+cu130 -> 2.14.0+cu128"),
        ("Flashinfer_Python==0.7.3", "flashinfer-python 0.7.2 -> 0.7.3"),
        ("sglang==0.5.23", "sglang absent -> 0.5.23"),
        ("vllm @ git+https://github.com/vllm-project/vllm@refs/pull/40898/head", None),
        ("vllm @ git+https://github.com/vllm-project/vllm@0a1b2c3d", None),  # a commit prefix
        (
            "vllm @ git+https://github.com/vllm-project/vllm@main",
            "vllm 0.34.1.dev12+g0a1b2c3 from git@refs/pull/40898/head -> git@main",
        ),
        (
            "vllm @ git+https://github.com/someone/vllm@refs/pull/40898/head",
            "vllm 0.34.1.dev12+g0a1b2c3 from git@refs/pull/40898/head -> "
            "https://github.com/someone/vllm@refs/pull/40898/head",
        ),
        ("vllm==0.34.0", "vllm 0.34.1.dev12+g0a1b2c3 -> 0.34.0"),
        ("triton @ git+https://github.com/triton-lang/triton@v3.8.0", "triton 3.8.0 -> git@v3.8.0"),
    ],
)
def test_installed_versus_pin(spec: str, why: str | None) -> None:
    assert check_installed(parse_requirement(spec), installed()) == why


def test_install_plan_only_what_differs_then_nothing() -> None:
    reqs = tuple(
        parse_requirement(s)
        for s in (
            "torch==2.14.0",
            "triton==3.8.0",
            "vllm @ git+https://github.com/vllm-project/vllm@refs/pull/40898/head",
            "flashinfer-python==0.7.3",
        )
    )
    python = f"{VENV}/bin/python"
    index = "https://download.pytorch.org/whl/cu130"
    plan = plan_install(reqs, installed(), python, None, index)
    [run] = plan.changes
    assert run.command == (
        f"{python} -m pip install --disable-pip-version-check --no-input -q "
        f"--extra-index-url {index} flashinfer-python==0.7.3"
    )
    assert plan.reason == "install flashinfer-python 0.7.2 -> 0.7.3"
    with_uv = plan_install(reqs, {}, python, "/usr/local/bin/uv", index).changes[0].command
    assert with_uv.startswith(
        f"/usr/local/bin/uv pip install --python {python} --extra-index-url {index} "
        "--index-strategy unsafe-best-match torch==2.14.0 triton==3.8.0 "
    )
    assert with_uv.endswith(
        "'vllm @ git+https://github.com/vllm-project/vllm@refs/pull/40898/head' flashinfer-python==0.7.3"
    )
    done = {**installed(), "flashinfer-python": {"version": "0.7.3"}}
    again = plan_install(reqs, done, python, None, index)
    assert not again.will_change and again.reason.startswith("all 4 pins installed: torch 2.14.0+cu130")
