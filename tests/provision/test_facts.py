"""GPU fact parsers on outputs captured on a real H200, and on synthesized Blackwell outputs."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ops.gpu import facts
from tests.provision.helpers import H200, SYNTH, fake_nvidia_smi, h200, path_with, synth

H200_GPU = {
    "index": 0,
    "name": "NVIDIA H200",
    "compute_cap": "9.0",
    "driver": "580.159.04",
    "memory_mib": 143771,
}


@pytest.mark.parametrize("capture", ["query_csv_noheader_nounits", "query_csv_noheader", "query_csv"])
def test_gpu_query_every_csv_format_of_the_h200(capture: str) -> None:
    code, out, _ = h200(capture)
    assert code == 0
    assert facts.parse_gpu_query(out) == [H200_GPU]


def test_gpu_query_blackwell_and_eight_gpus() -> None:
    [rtx] = facts.parse_gpu_query(synth("rtx_pro_6000.query.out"))
    assert rtx["compute_cap"] == "12.0" and rtx["memory_mib"] == 97887
    b200 = facts.parse_gpu_query(synth("b200x8.query.out"))
    assert [g["index"] for g in b200] == list(range(8)) and {g["compute_cap"] for g in b200} == {"10.0"}


def test_fp8_support_by_compute_capability() -> None:
    assert facts.fp8_support(["9.0"]) == facts.fp8_support(["12.0", "12.0"]) == "e4m3"
    assert facts.fp8_support(["8.9", "10.0"]) == "e4m3"  # Ada and B200
    assert facts.fp8_support(["8.0"]) == "no" and facts.fp8_support(["8.0", "9.0"]) == "mixed"
    assert facts.fp8_support([]) is None


@pytest.mark.parametrize(
    "text", ["NVIDIA H200, 9.0, 580.159.04", "NVIDIA H200, nine, 580.1, 1", "X, 9.0, abc, 1"]
)
def test_gpu_query_rejects_other_shapes(text: str) -> None:
    with pytest.raises(facts.FactError):
        facts.parse_gpu_query(text)


def test_cuda_version_from_version_and_from_the_table_header() -> None:
    assert facts.parse_cuda_version(h200("nvidia_smi_version")[1]) == "13.0"
    assert facts.parse_cuda_version(h200("nvidia_smi")[1]) == "13.0"
    assert facts.parse_cuda_version(synth("rtx_pro_6000.version.out")) == "12.9"
    assert facts.parse_cuda_version("no such line") is None


def test_nvidia_facts_present_and_every_way_of_missing() -> None:
    query, version = h200("query_csv_noheader_nounits"), h200("nvidia_smi_version")
    ok = facts.nvidia_facts(query[:2], version[:2])
    assert ok == {"present": True, "error": None, "gpus": [H200_GPU], "driver": "580.159.04", "cuda": "13.0"}
    bad_field = h200("query_bad_field")
    assert facts.nvidia_facts(bad_field[:2], None)["error"] == (
        'nvidia-smi failed (exit 2): Field "no_such_field" is not a valid field to query.'
    )
    no_module = facts.nvidia_facts((9, synth("no_driver.query.out")), None)
    assert not no_module["present"] and "couldn't communicate with the NVIDIA driver" in no_module["error"]
    assert facts.nvidia_facts((127, ""), None)["error"] == "nvidia-smi not found"
    assert facts.nvidia_facts((0, "\n"), None)["error"] == "nvidia-smi lists no GPU"


def test_df_os_release_python_version_on_the_h200() -> None:
    code, out, _ = h200("df_opt")
    assert code == 0
    disk = facts.parse_df("path=/opt\n" + out)
    assert disk == {"path": "/opt", "total_bytes": 270553174016, "free_bytes": 68701896704, "mount": "/"}
    with pytest.raises(facts.FactError):
        facts.parse_df(h200("df_missing")[2])
    assert facts.parse_os_release(h200("os_release")[1]) == {
        "id": "ubuntu",
        "version_id": "24.04",
        "pretty_name": "Ubuntu 24.04.3 LTS",
    }
    assert facts.parse_python_version(h200("python_version")[1]) == "3.12.3"
    assert facts.parse_python_version("sh: 1: python3: not found") is None


def test_python_probe_of_the_h200_and_the_facts_row() -> None:
    code, out, _ = h200("probe")
    assert code == 0
    env = facts.parse_probe(out)
    assert env["torch"]["arch_list"][-1] == "sm_120" and env["torch"]["devices"][0]["capability"] == [9, 0]
    host = {
        "nvidia": facts.nvidia_facts(h200("query_csv")[:2], h200("nvidia_smi_version")[:2]),
        "python": "3.12.3",
    }
    row = facts.summary(host, env)
    assert row == {
        "gpu": "1x NVIDIA H200",
        "capability": "sm_90",
        "fp8": "e4m3",
        "driver": "580.159.04",
        "cuda": "13.0",
        "torch": "2.11.0",
        "torch_cuda": "13.0",
        "triton": "3.6.0",
        "vllm": None,
        "sglang": None,
        "flashinfer": None,
        "python": "3.12.3",
        "systems": "ddtree (torch 2.11.0)",
    }
    # Each serving system lives in its own venv (fab provision, host var systems): fab facts says
    # which the host can serve, and how many GPUs tensor parallelism can use.
    vllm_venv = {"packages": {"vllm": {"version": "0.34.0"}, "torch": {"version": "2.14.0"}}}
    row = facts.summary(host, env, {"vllm": vllm_venv, "sglang": None})
    assert row["systems"] == "ddtree (torch 2.11.0), vllm 0.34.0 (tp <= 1)"
    no_gpu = {**host, "nvidia": {**host["nvidia"], "gpus": []}}
    assert facts.summary(no_gpu, None, {"vllm": vllm_venv})["systems"] == "vllm 0.34.0 (no GPU)"
    with pytest.raises(facts.FactError, match="did not print JSON"):
        facts.parse_probe("Traceback (most recent call last):\n  boom")


def test_the_real_host_command_with_a_stand_in_nvidia_smi(tmp_path: Path) -> None:
    """The one-round-trip shell command, run for real; nvidia-smi replays the H200 capture."""
    bin_dir = tmp_path / "bin"
    fake_nvidia_smi(bin_dir, H200 / "query_csv_noheader_nounits.out", H200 / "nvidia_smi_version.out")
    base = tmp_path / "not" / "yet" / "base"
    command = facts.host_command(str(base), "python3")
    out = subprocess.run(
        ["sh", "-c", command], capture_output=True, text=True, env={"PATH": path_with(bin_dir)}, check=True
    ).stdout
    host = facts.parse_host(out)
    assert host["nvidia"]["gpus"] == [H200_GPU] and host["nvidia"]["cuda"] == "13.0"
    assert host["disk"]["path"] == str(tmp_path) and host["disk"]["free_bytes"] > 0
    assert host["python"] and host["venv_python"] is None


def test_the_real_host_command_without_nvidia_smi(tmp_path: Path) -> None:
    out = subprocess.run(
        ["sh", "-c", facts.host_command(str(tmp_path))],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
        check=True,
    ).stdout
    assert facts.parse_host(out)["nvidia"]["error"] == "nvidia-smi not found"


def test_synthesized_files_are_labelled() -> None:
    assert "NOT captured on hardware" in (SYNTH / "README.md").read_text()
