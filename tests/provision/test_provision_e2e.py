"""`fab provision` end to end over real sshd daemons (tests/sshd.py) and the local connection.

The cpu profile converges (check mode writes nothing; the second run changes nothing; models come
from a stand-in `hf`, the token only in its environment). Policy failures each give one line.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.provision.helpers import H200, fake_hf, fake_nvidia_smi, path_with

REPO = Path(__file__).resolve().parents[2]
FAB = str(Path(sys.executable).parent / "fab")
TOKEN = "hf_E2eProvisionToken_abcdef0123456789"


def fab(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [FAB, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )


def tree(base: Path) -> list[tuple[str, str, str]]:
    rows = []
    for root, dirs, files in os.walk(base):
        for name in dirs + files:
            path = Path(root) / name
            digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
            rows.append((str(path.relative_to(base)), oct(path.stat().st_mode), digest))
    return sorted(rows)


def summary(results: Path) -> dict:
    return json.loads((results / "latest" / "summary.json").read_text())


@pytest.mark.slow
def test_provision_cpu_profile_check_then_converge_then_nothing(
    sshd_hosts, make_inventory, tmp_path: Path
) -> None:
    hosts = sshd_hosts(2)
    log = tmp_path / "hf.log"
    hf = fake_hf(tmp_path / "bin", log)
    models = [
        {"name": "target", "repo": "Qwen/Qwen3-8B", "size_gb": 0.001},
        {"name": "drafter", "repo": "z-lab/Qwen3-8B-DFlash-b16"},
    ]
    inventory = make_inventory(
        hosts,
        host_vars={"h1": {"profile": "cpu", "models": models, "hf_cli": str(hf)}, "h2": {"profile": "cpu"}},
        host_fields={"h1": {"secrets": {"HF_TOKEN": {"env": "SPECOPS_TEST_HF_TOKEN"}}}},
    )
    results = tmp_path / "results"
    env = {"SPECOPS_TEST_HF_TOKEN": TOKEN}
    common = ["--inventory", str(inventory), "--results", str(results)]
    empty = {h.name: tree(h.base) for h in hosts}

    checked = fab("provision", "--check", *common, env=env)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert {h.name: tree(h.base) for h in hosts} == empty, "--check wrote on a host"
    assert not log.exists()
    assert summary(results)["check"] is True and summary(results)["changed"] == 2

    first = fab("provision", *common, env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    steps = {name: {s["name"]: s for s in h["steps"]} for name, h in summary(results)["hosts"].items()}
    assert steps["h1"]["requirements of the profile"]["message"].startswith(
        "profile cpu: no GPU needed; Python 3."
    )
    assert steps["h1"]["models"]["message"] == "download target, drafter with the token file"
    assert steps["h2"]["models"]["message"] == "no models listed for this host"
    assert steps["h1"]["pinned packages"]["status"] == "skipped"  # cpu hosts install only when asked
    assert steps["h1"]["smoke test the specops kernels"]["message"] == (
        "skipped on profile cpu: torch/triton not importable in this venv (ModuleNotFoundError: No module named "
        "'torch')"
    )
    for h in hosts:
        assert (h.base / "venv" / "bin" / "python").exists()
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(calls) == 2 and all(c["token"] == TOKEN and TOKEN not in " ".join(c["argv"]) for c in calls)
    assert (hosts[0].base / "run" / "hf.token").stat().st_mode & 0o777 == 0o600

    second = fab("provision", *common, env=env)
    assert second.returncode == 0, second.stdout + second.stderr
    again = summary(results)
    assert again["changed"] == 0 and again["failed"] == 0
    assert {s["status"] for h in again["hosts"].values() for s in h["steps"]} == {"ok", "skipped"}
    assert len(log.read_text().splitlines()) == 2, "the second run downloaded again"
    assert "GPU facts: no NVIDIA GPU (nvidia-smi not found); no venv yet" in first.stdout
    assert (
        "GPU facts: no NVIDIA GPU (nvidia-smi not found); venv has no torch, triton or vllm" in second.stdout
    )

    for path in [*results.rglob("*"), *[h.dir / "sshd.log" for h in hosts]]:
        if path.is_file():
            assert TOKEN not in path.read_text(errors="replace"), f"token leaked into {path}"
    assert TOKEN not in first.stdout + first.stderr + second.stdout


def test_policy_failures_are_one_line_each(sshd_hosts, make_inventory, tmp_path: Path) -> None:
    """A bad profile name, a host without driver, too little disk, the wrong compute capability (the
    local host, whose nvidia-smi replays the real H200 capture), in one parallel run."""
    hosts = sshd_hosts(3)
    inventory = make_inventory(
        hosts,
        local=True,
        host_vars={
            "h1": {"profile": "blackwel"},
            "h2": {"profile": "hopper"},
            "h3": {"profile": "cpu", "min_free_gb": 100000},
        },
    )
    data = yaml.safe_load(inventory.read_text())
    data["hosts"]["local"]["vars"] = {"profile": "blackwell"}
    inventory.write_text(yaml.safe_dump(data))
    bin_dir = tmp_path / "fake-bin"
    fake_nvidia_smi(bin_dir, H200 / "query_csv_noheader_nounits.out", H200 / "nvidia_smi_version.out")
    results = tmp_path / "results"

    run = fab(
        "provision",
        "--inventory",
        str(inventory),
        "--results",
        str(results),
        env={"PATH": path_with(bin_dir)},
    )
    assert run.returncode == 1, run.stdout + run.stderr
    result = summary(results)
    assert result["failed"] == 4
    messages = {}
    for name, host in result["hosts"].items():
        [failed] = [s for s in host["steps"] if s["status"] == "failed"]
        assert failed["name"] == "requirements of the profile"
        assert "\n" not in failed["message"] and "(fix: " in failed["message"]
        messages[name] = failed["message"]
    assert messages["h1"] == (
        "step 'requirements of the profile' on host 'h1': argument 'profile': unknown profile 'blackwel' "
        "(fix: did you mean 'blackwell'? set the host's vars.profile in the inventory to one of blackwell, "
        "hopper, cpu)"
    )
    assert messages["h2"].startswith(
        "no NVIDIA GPU/driver on h2: nvidia-smi not found (fix: install the NVIDIA driver R580+"
    )
    assert messages["h3"].startswith("h3: ") and messages["h3"].endswith(
        ", 100000.0 GB needed for the venv and models (min_free_gb) (fix: free disk space, or set the host's base "
        "to a larger filesystem)"
    )
    assert messages["local"] == (
        "local: GPU 0 (NVIDIA H200) is sm_90, profile 'blackwell' needs sm_120 or sm_100 "
        "(fix: set the host's profile to 'hopper' in the inventory)"
    )
    for name in messages:
        assert f"FAILED {name} / requirements of the profile (gpu_policy): " in run.stdout
