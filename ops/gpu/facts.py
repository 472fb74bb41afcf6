"""GPU host facts: the commands that read them and pure parsers of their output.

One shell round trip (`host_command`) prints labelled sections -- the `nvidia-smi` CSV query,
`nvidia-smi --version` (the CUDA version the driver supports; `--query-gpu` has no field for it),
`df` at the base directory, `/etc/os-release` and the host's `python3` -- each with its exit code.
A second command runs `remote/probe.py` with the venv's Python (versions of torch, triton, vllm,
...). The parsers are tested on outputs captured on a real H200 (`tests/provision/captures/`).
"""

from __future__ import annotations

import csv
import json
import re
import shlex
from importlib import resources
from typing import Any

from ops.layout import HostLayout
from ops.shell import quote

QUERY_FIELDS = ("name", "compute_cap", "driver_version", "memory.total")
QUERY = f"nvidia-smi --query-gpu={','.join(QUERY_FIELDS)} --format=csv,noheader,nounits"
MARK = "=== specops-gpu:"
NOT_FOUND = 127


class FactError(ValueError):
    """Output that does not have the documented shape; the message quotes the offending line."""


def host_command(base: str, python: str = "python3", venv: str | None = None) -> str:
    """Everything about the host in one round trip; each section ends with its exit code."""
    b = quote(base)
    venv_python = quote(f"{venv}/bin/python" if venv else HostLayout(base).python)
    sections = {
        "query": f"command -v nvidia-smi >/dev/null || exit {NOT_FOUND}; {QUERY}",
        "version": f"command -v nvidia-smi >/dev/null || exit {NOT_FOUND}; nvidia-smi --version",
        "disk": f'p={b}; while [ ! -e "$p" ]; do p=$(dirname "$p"); done; echo "path=$p"; df -P -B1 "$p"',
        "os": "cat /etc/os-release",
        "python": f"{quote(python)} --version",
        "venv": f"{venv_python} --version",
        "tools": "for t in uv hf; do command -v $t || true; done",
    }
    return "; ".join(
        f"echo '{MARK}{name}'; ( {cmd} ) 2>&1; echo \"{MARK}rc=$?\"" for name, cmd in sections.items()
    )


def split_sections(stdout: str) -> dict[str, tuple[int, str]]:
    """`host_command` output -> {section: (exit code, text)}."""
    sections: dict[str, tuple[int, str]] = {}
    name, lines = None, []
    for line in stdout.splitlines():
        if line.startswith(f"{MARK}rc="):
            if name is not None:
                sections[name] = (int(line[len(MARK) + 3 :]), "\n".join(lines))
            name, lines = None, []
        elif line.startswith(MARK):
            name, lines = line[len(MARK) :].strip(), []
        elif name is not None:
            lines.append(line)
    return sections


def parse_gpu_query(text: str) -> list[dict[str, Any]]:
    """`nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv[,noheader][,nounits]`.

    Accepts all three formats (header line, " MiB" units) so a capture from any of them parses.
    """
    gpus = []
    rows = [row for row in csv.reader(text.splitlines(), skipinitialspace=True) if row]
    for row in rows:
        if row[0].strip() == "name":  # the header of --format=csv
            continue
        if len(row) != len(QUERY_FIELDS):
            raise FactError(
                f"expected {len(QUERY_FIELDS)} CSV fields ({', '.join(QUERY_FIELDS)}), got {row!r}"
            )
        name, cap, driver, memory = (cell.strip() for cell in row)
        if not re.fullmatch(r"\d+\.\d+", cap):
            raise FactError(f"compute capability {cap!r} of GPU {name!r} is not MAJOR.MINOR")
        if not re.fullmatch(r"\d+(\.\d+)+", driver):
            raise FactError(f"driver version {driver!r} of GPU {name!r} is not numeric")
        memory = memory.removesuffix("MiB").strip()
        gpus.append(
            {
                "index": len(gpus),
                "name": name,
                "compute_cap": cap,
                "driver": driver,
                "memory_mib": int(memory) if memory.isdigit() else None,
            }
        )
    return gpus


FP8_CAPABILITY = (8, 9)  # e4m3 tensor cores: Ada, Hopper (sm_90), Blackwell (sm_100, sm_120) and newer


def fp8_support(compute_caps: list[str]) -> str | None:
    """Whether the GPUs multiply FP8 (e4m3) in their tensor cores, as `fab facts` shows it: FP8
    checkpoints are served at full speed only there (elsewhere the runtime dequantizes them)."""
    if not compute_caps:
        return None
    have = {tuple(int(p) for p in cap.split(".")) >= FP8_CAPABILITY for cap in compute_caps}
    return "e4m3" if have == {True} else "no" if have == {False} else "mixed"


def parse_cuda_version(text: str) -> str | None:
    """The CUDA version the driver supports, from `nvidia-smi --version` or plain `nvidia-smi`."""
    match = re.search(r"CUDA Version\s*:\s*(\d+\.\d+)", text)
    return match.group(1) if match else None


def nvidia_facts(query: tuple[int, str], version: tuple[int, str] | None) -> dict[str, Any]:
    """Combine the query and version sections; `error` says why there is no usable GPU."""
    code, text = query
    facts: dict[str, Any] = {"present": False, "error": None, "gpus": [], "driver": None, "cuda": None}
    if code == NOT_FOUND:
        facts["error"] = "nvidia-smi not found"
        return facts
    if code != 0:
        first = next((line.strip() for line in text.splitlines() if line.strip()), f"exit {code}")
        facts["error"] = f"nvidia-smi failed (exit {code}): {first}"
        return facts
    gpus = parse_gpu_query(text)
    if not gpus:
        facts["error"] = "nvidia-smi lists no GPU"
        return facts
    facts.update(present=True, gpus=gpus, driver=gpus[0]["driver"])
    if version is not None and version[0] == 0:
        facts["cuda"] = parse_cuda_version(version[1])
    return facts


def parse_df(text: str) -> dict[str, Any]:
    """`echo path=P; df -P -B1 P`: the checked path, its filesystem's total and free bytes."""
    lines = [line for line in text.splitlines() if line.strip()]
    path = next((line[5:] for line in lines if line.startswith("path=")), None)
    rows = [line for line in lines if not line.startswith(("path=", "Filesystem"))]
    if not rows:
        raise FactError(f"df printed no filesystem line: {text.strip()!r}")
    parts = rows[-1].split()
    if len(parts) < 6 or not (parts[1].isdigit() and parts[3].isdigit()):
        raise FactError(f"df line is not 'fs blocks used available capacity mount': {rows[-1]!r}")
    return {
        "path": path,
        "total_bytes": int(parts[1]),
        "free_bytes": int(parts[3]),
        "mount": " ".join(parts[5:]),
    }


def parse_os_release(text: str) -> dict[str, str]:
    """`/etc/os-release` (shell-style KEY=value) -> id, version_id, pretty_name."""
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and not key.startswith("#"):
            try:
                words = shlex.split(value)
            except ValueError:
                words = [value]
            fields[key.strip().lower()] = " ".join(words)
    return {
        "id": fields.get("id", "unknown"),
        "version_id": fields.get("version_id", ""),
        "pretty_name": fields.get("pretty_name", fields.get("name", "unknown")),
    }


def parse_python_version(text: str) -> str | None:
    """`python3 --version` -> "3.12.3" (None when the interpreter is missing)."""
    match = re.search(r"Python (\d+\.\d+\.\d+\S*)", text)
    return match.group(1) if match else None


def parse_host(stdout: str) -> dict[str, Any]:
    """The whole `host_command` output -> plain JSON-able facts."""
    sections = split_sections(stdout)
    missing = [name for name in ("query", "disk", "os", "python") if name not in sections]
    if missing:
        raise FactError(f"host facts command printed no {', '.join(missing)} section(s)")
    disk_code, disk_text = sections["disk"]
    python_code, python_text = sections["python"]
    venv_code, venv_text = sections.get("venv", (1, ""))
    tools = sections.get("tools", (0, ""))[1].split()
    return {
        "nvidia": nvidia_facts(sections["query"], sections.get("version")),
        "disk": parse_df(disk_text) if disk_code == 0 else {"error": disk_text.strip()},
        "os": parse_os_release(sections["os"][1]),
        "python": parse_python_version(python_text) if python_code == 0 else None,
        "venv_python": parse_python_version(venv_text) if venv_code == 0 else None,
        "uv": next((t for t in tools if t.endswith("/uv")), None),
        "hf": next((t for t in tools if t.endswith("/hf")), None),
    }


def probe_script() -> str:
    """Source of `remote/probe.py`, fed to the venv's Python on stdin."""
    return resources.files("ops.gpu.remote").joinpath("probe.py").read_text()


def parse_probe(stdout: str) -> dict[str, Any]:
    """`remote/probe.py` output: its last line is one JSON object (warnings may come before it)."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        raise FactError("the Python probe printed nothing")
    try:
        facts = json.loads(lines[-1])
    except ValueError:
        raise FactError(f"the Python probe did not print JSON: {lines[-1][:200]!r}") from None
    if not isinstance(facts, dict) or "python" not in facts or "packages" not in facts:
        raise FactError(f"the Python probe printed unexpected JSON: {lines[-1][:200]!r}")
    return facts


def servable(host: dict[str, Any], env: dict[str, Any] | None, systems: dict[str, Any]) -> list[str]:
    """Which systems the host can serve: our runtime where its venv has torch; vLLM or SGLang where
    its own venv (``systems``: name -> probe facts, None when absent) has it and there is a GPU
    (with the GPU count, the most tensor parallelism can use)."""
    found = []
    torch = ((env or {}).get("packages") or {}).get("torch")
    if torch:
        found.append(f"ddtree (torch {torch['version']})")
    gpus = len(host["nvidia"]["gpus"])
    for name, facts in systems.items():
        package = ((facts or {}).get("packages") or {}).get(name)
        if package:
            found.append(
                f"{name} {package['version']} (tp <= {gpus})"
                if gpus
                else f"{name} {package['version']} (no GPU)"
            )
    return found


def summary(
    host: dict[str, Any], env: dict[str, Any] | None, systems: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The row `fab facts` shows: GPU, capability, FP8 support, driver, CUDA, torch, triton, vllm, and which
    serving systems the host has (``systems``: the probe facts of each system's own venv)."""
    nvidia = host["nvidia"]
    gpus = nvidia["gpus"]
    names = sorted({g["name"] for g in gpus})
    packages = (env or {}).get("packages", {})

    def version(name: str) -> str | None:
        info = packages.get(name)
        return info["version"] if info else None

    return {
        "gpu": f"{len(gpus)}x {', '.join(names)}" if gpus else None,
        "capability": ", ".join(sorted({f"sm_{g['compute_cap'].replace('.', '')}" for g in gpus})) or None,
        "fp8": fp8_support([g["compute_cap"] for g in gpus]),
        "driver": nvidia["driver"],
        "cuda": nvidia["cuda"],
        "torch": version("torch"),
        "torch_cuda": ((env or {}).get("torch") or {}).get("cuda"),
        "triton": version("triton"),
        "vllm": version("vllm"),
        "sglang": version("sglang"),
        "flashinfer": version("flashinfer-python"),
        "python": (env or {}).get("python") or host["python"],
        "systems": ", ".join(servable(host, env, systems or {})) or None,
    }
