"""The requirement policy per profile, fed with real H200 captures and synthesized Blackwell ones.

Every failure must be exactly one line that names the host, the cause and "(fix: ...)".
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ops.errors import InputFileError
from ops.gpu import facts
from ops.gpu.pins import load_pins
from ops.gpu.policy import PROFILES, check, profile_named
from tests.provision.helpers import h200, synth

PINS = load_pins(Path(__file__).resolve().parents[2] / "playbooks" / "pins.yaml")

GB = 10**9


def host_facts(query: tuple[int, str], version: str | None, free_gb: float = 68.7) -> dict:
    return {
        "nvidia": facts.nvidia_facts(query, (0, version) if version is not None else None),
        "disk": {"path": "/opt", "total_bytes": 270 * GB, "free_bytes": int(free_gb * GB), "mount": "/"},
    }


H200 = host_facts(
    h200("query_csv_noheader_nounits")[:2],
    h200("nvidia_smi_version")[1],
    free_gb=int(h200("df_opt")[1].splitlines()[1].split()[3]) / GB,
)
RTX_R575 = host_facts((0, synth("rtx_pro_6000.query.out")), synth("rtx_pro_6000.version.out"))
RTX_R580 = host_facts((0, synth("rtx_pro_6000_r580.query.out")), synth("rtx_pro_6000_r580.version.out"))
B200 = host_facts((0, synth("b200x8.query.out")), synth("b200x8.version.out"))
L40S = host_facts((0, synth("l40s.query.out")), synth("b200x8.version.out"))
NO_MODULE = host_facts((9, synth("no_driver.query.out")), None)
NO_SMI = host_facts((127, ""), None)


def failures(facts_: dict, profile: str, need_gb: float = 26, python: str | None = "3.12.3") -> list[str]:
    return check(
        "gpu1",
        PROFILES[profile],
        PINS[profile],
        facts_,
        need_gb=need_gb,
        need_what="the venv (25 GB)",
        python=python,
        python_which="python3 (makes the venv)",
    )


def one_line_with_fix(line: str) -> None:
    assert "\n" not in line and line.startswith(("gpu1", "no NVIDIA GPU/driver on gpu1")) and "(fix: " in line


@pytest.mark.parametrize(
    ("facts_", "profile"),
    [(H200, "hopper"), (RTX_R580, "blackwell"), (B200, "blackwell"), (NO_SMI, "cpu"), (H200, "cpu")],
)
def test_hosts_that_meet_their_profile(facts_: dict, profile: str) -> None:
    assert failures(facts_, profile) == []


def test_the_real_h200_under_the_blackwell_profile_is_the_wrong_compute_capability() -> None:
    [line] = failures(H200, "blackwell")
    one_line_with_fix(line)
    assert line == (
        "gpu1: GPU 0 (NVIDIA H200) is sm_90, profile 'blackwell' needs sm_120 or sm_100 "
        "(fix: set the host's profile to 'hopper' in the inventory)"
    )


def test_a_gpu_no_profile_allows() -> None:
    [line] = failures(L40S, "hopper")
    one_line_with_fix(line)
    assert "is sm_89" in line and "specops supports sm_120, sm_100, sm_90" in line


def test_an_r575_driver_is_too_old_for_the_cu130_build() -> None:
    [line] = failures(RTX_R575, "blackwell")
    one_line_with_fix(line)
    assert line.startswith("gpu1: driver 575.57.08 (supports CUDA 12.9) is too old for the cu130 build")
    assert "needs R580+ (fix: install driver R580 or newer" in line


@pytest.mark.parametrize("facts_", [NO_MODULE, NO_SMI])
def test_a_host_without_driver_fails_unless_cpu(facts_: dict) -> None:
    [line] = failures(facts_, "hopper")
    one_line_with_fix(line)
    assert line.startswith("no NVIDIA GPU/driver on gpu1: ")
    assert "install the NVIDIA driver R580+" in line and "profile: cpu" in line
    assert failures(facts_, "cpu") == []


def test_too_little_disk() -> None:
    [line] = failures(H200, "hopper", need_gb=100)
    one_line_with_fix(line)
    assert line.startswith("gpu1: 68.7 GB free on / (holding /opt), 100.0 GB needed for the venv (25 GB)")


@pytest.mark.parametrize(
    ("python", "expected"),
    [
        ("3.10.12", "gpu1: python3 (makes the venv) is Python 3.10.12, profile 'hopper' supports 3.11..3.14"),
        (None, "gpu1: no python3 (makes the venv) found"),
    ],
)
def test_unsupported_or_missing_python(python: str | None, expected: str) -> None:
    [line] = failures(H200, "hopper", python=python)
    one_line_with_fix(line)
    assert line.startswith(expected)


def test_failures_are_all_reported_in_fixing_order() -> None:
    lines = failures(RTX_R575, "hopper", need_gb=1000, python="3.9.1")
    assert len(lines) == 4
    assert (
        "is sm_120" in lines[0]
        and "driver 575" in lines[1]
        and "Python 3.9.1" in lines[2]
        and "GB free" in lines[3]
    )
    for line in lines:
        one_line_with_fix(line)


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        ("blackwel", "did you mean 'blackwell'?"),
        ("gpu", "set the host's"),
        (3, "one of blackwell, hopper, cpu"),
    ],
)
def test_a_bad_profile_name_is_one_line(name, hint: str) -> None:
    with pytest.raises(ValueError) as info:
        profile_named(name)
    message = str(info.value)
    assert (
        "\n" not in message
        and message.startswith(f"unknown profile {str(name)!r} (fix: ")
        and hint in message
    )


@pytest.mark.parametrize("name", ["", None])
def test_no_profile_at_all(name) -> None:
    with pytest.raises(
        ValueError, match=r"^the host has no profile \(fix: set vars.profile in the inventory"
    ):
        profile_named(name)


def test_the_shipped_pins(tmp_path: Path) -> None:
    assert {p: PINS[p].cuda for p in PINS} == {"blackwell": "cu130", "hopper": "cu130", "cpu": "cpu"}
    assert [r.spec for r in PINS["blackwell"].requirements()] == [
        "torch==2.14.0",
        "triton==3.8.0",
        "fla-core==0.6.0",
    ]
    assert [r.spec for r in PINS["blackwell"].requirements("vllm")] == [
        "torch==2.14.0",
        "triton==3.8.0",
        "vllm==0.34.0",
        "flashinfer-python==0.7.3",
    ]
    assert PINS["hopper"].requirements("sglang")[-1].spec == "sglang==0.5.23"
    with pytest.raises(ValueError, match="no pin set 'nope'"):
        PINS["cpu"].requirements("nope")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("profiles: {cpu: {cuda: cu999}}", "profiles.cpu.cuda is 'cu999' (fix: use one of"),
        (
            "profiles: {cpu: {cuda: cpu, python: {min: '3.10', max: '3.14'}, sets: {a: ['torch>=2']}}}",
            "profiles.cpu.sets.a: requirement 'torch>=2' is neither",
        ),
        (
            "profiles: {cpu: {cuda: cpu, python: {min: 3.1O, max: '3.14'}, sets: {a: [x==1]}}}",
            "python.min is '3.1O'",
        ),
        ("profiles: {cpu: {cuda: cpu, pyhton: {}}}", "unknown key 'pyhton'"),
        ("profiles: [", "invalid YAML"),
    ],
)
def test_a_bad_pins_file_names_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "pins.yaml"
    path.write_text(text)
    with pytest.raises(InputFileError) as info:
        load_pins(path)
    assert str(info.value).startswith(str(path)) and message in str(info.value)


def test_eight_b200_under_hopper_give_one_line() -> None:
    [line] = failures(B200, "hopper")
    one_line_with_fix(line)
    assert line.startswith(
        "gpu1: GPUs 0,1,2,3,4,5,6,7 (NVIDIA B200) are sm_100, profile 'hopper' needs sm_90"
    )
