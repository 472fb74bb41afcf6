"""The ``facts`` step: what a host is (OS, CPU, memory, disk at base, python, systemd, GPUs)
and what specops put there (the ``<base>/current`` release, the ``<base>/venv`` Python).

One command prints labelled sections; each section has its own pure parser, tested on captured
outputs in ``tests/ops/step_cases/facts/``. The step is read-only, so it always reports ``ok``;
its facts are registered for later steps and ``fab facts`` tabulates them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ops.api.args import arguments
from ops.api.changes import Fact, Plan, StepFailed
from ops.gpu.facts import FactError, parse_gpu_query
from ops.layout import HostLayout
from ops.shell import quote
from ops.steps.base import Step, register

if TYPE_CHECKING:
    from ops.connection import CommandResult

MARK = "=== specops:"


def facts_command(base: str) -> str:
    """Everything in one round trip; every probe tolerates a missing tool."""
    b, layout = quote(base), HostLayout(base)
    sections = {
        "os": "cat /etc/os-release 2>/dev/null; echo kernel=$(uname -r) arch=$(uname -m)",
        "cpu": "nproc 2>/dev/null; grep -m1 -E '^(model name|Model|Hardware)' /proc/cpuinfo 2>/dev/null",
        "memory": "grep -E '^(MemTotal|MemAvailable):' /proc/meminfo 2>/dev/null",
        "disk": f'p={b}; while [ ! -e "$p" ]; do p=$(dirname "$p"); done; df -Pk "$p" 2>/dev/null',
        "python": "command -v python3 && python3 -c 'import sys; print(sys.version.split()[0])'",
        "systemd": (
            "[ -d /run/systemd/system ] && echo pid1=yes || echo pid1=no; "
            "echo uid=$(id -u); systemctl --version 2>/dev/null | head -n1; "
            '[ -S "/run/user/$(id -u)/bus" ] && echo user_bus=yes || echo user_bus=no'
        ),
        "gpu": "nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total "
        "--format=csv,noheader 2>/dev/null || true",
        "release": f"readlink {quote(layout.link('current'))} 2>/dev/null || true",
        "venv": f"{quote(layout.python)} -c 'import sys; print(sys.version.split()[0])' 2>/dev/null || true",
    }
    return "; ".join(f"echo '{MARK}{name}'; {{ {cmd}; }}" for name, cmd in sections.items())


def split_sections(stdout: str) -> dict[str, list[str]]:
    sections: dict[str, list[str]] = {}
    current = None
    for line in stdout.splitlines():
        if line.startswith(MARK):
            current = line[len(MARK) :].strip()
            sections[current] = []
        elif current is not None and line.strip():
            sections[current].append(line.strip())
    return sections


def parse_os(lines: list[str]) -> dict[str, Any]:
    fields = {}
    for line in lines:
        if line.startswith("kernel="):
            for part in line.split():
                key, _, value = part.partition("=")
                fields[key] = value
        elif "=" in line:
            key, _, value = line.partition("=")
            fields[key.lower()] = value.strip().strip('"')
    return {
        "id": fields.get("id", "unknown"),
        "version": fields.get("version_id", ""),
        "name": fields.get("pretty_name", fields.get("name", "unknown")),
        "kernel": fields.get("kernel", ""),
        "arch": fields.get("arch", ""),
    }


def parse_cpu(lines: list[str]) -> dict[str, Any]:
    count = int(lines[0]) if lines and lines[0].isdigit() else None
    model = next((line.split(":", 1)[1].strip() for line in lines[1:] if ":" in line), "unknown")
    return {"count": count, "model": model}


def parse_memory(lines: list[str]) -> dict[str, Any]:
    kib = {}
    for line in lines:
        key, _, rest = line.partition(":")
        kib[key] = int(rest.split()[0])
    return {
        "total_gib": round(kib["MemTotal"] / 2**20, 1) if "MemTotal" in kib else None,
        "available_gib": round(kib["MemAvailable"] / 2**20, 1) if "MemAvailable" in kib else None,
    }


def parse_disk(lines: list[str]) -> dict[str, Any]:
    """``df -Pk``: header, then ``fs 1024-blocks used available capacity mountpoint``."""
    if len(lines) < 2:
        return {"free_gib": None, "total_gib": None, "mount": None}
    parts = lines[-1].split()
    return {
        "total_gib": round(int(parts[1]) / 2**20, 1),
        "free_gib": round(int(parts[3]) / 2**20, 1),
        "mount": parts[5],
    }


def parse_python(lines: list[str]) -> dict[str, Any]:
    if len(lines) < 2:
        return {"path": None, "version": None}
    return {"path": lines[0], "version": lines[1]}


def parse_systemd(lines: list[str]) -> dict[str, Any]:
    """Usable means PID 1 is systemd and we may drive it: as root, or with a user bus."""
    fields = dict(
        line.split("=", 1)
        for line in lines
        if "=" in line and line.split("=", 1)[0] in ("pid1", "uid", "user_bus")
    )
    version_line = next((line for line in lines if line.startswith("systemd ")), None)
    pid1 = fields.get("pid1") == "yes"
    root = fields.get("uid") == "0"
    return {
        "pid1": pid1,
        "version": version_line.split()[1] if version_line else None,
        "usable": pid1 and version_line is not None and (root or fields.get("user_bus") == "yes"),
        "scope": "system" if root else "user",
    }


def parse_gpu(lines: list[str]) -> list[dict[str, Any]]:
    """The nvidia-smi query section; the CSV parser itself lives with the other GPU facts."""
    try:
        return parse_gpu_query("\n".join(lines))
    except FactError as exc:
        raise StepFailed(f"unexpected nvidia-smi output: {exc}") from None


def parse_facts(result: CommandResult) -> dict[str, Any]:
    """Pure: the whole facts command output -> one nested dict."""
    sections = split_sections(result.stdout)
    if "os" not in sections:
        raise StepFailed("facts command printed nothing usable", command=result.command, stderr=result.stderr)
    return {
        "os": parse_os(sections.get("os", [])),
        "cpu": parse_cpu(sections.get("cpu", [])),
        "memory": parse_memory(sections.get("memory", [])),
        "disk": parse_disk(sections.get("disk", [])),
        "python": parse_python(sections.get("python", [])),
        "systemd": parse_systemd(sections.get("systemd", [])),
        "gpus": parse_gpu(sections.get("gpu", [])),
        "release": (sections.get("release") or [None])[0],
        "venv": (sections.get("venv") or [None])[0],
    }


def one_line(facts: dict[str, Any]) -> str:
    """A short human summary, used as the step's message."""
    gpus = facts["gpus"]
    gpu = f"{len(gpus)}x {gpus[0]['name']}" if gpus else "no GPU"
    return (
        f"{facts['os']['name']}, {facts['cpu']['count']} CPUs, {facts['memory']['total_gib']} GiB RAM, "
        f"{facts['disk']['free_gib']} GiB free, python {facts['python']['version']}, "
        f"systemd {'usable' if facts['systemd']['usable'] else 'unusable'}, {gpu}"
    )


@register
class Facts(Step):
    name = "facts"
    summary = "gather OS, CPU, memory, disk, python, systemd and GPU facts (read-only)"
    args = arguments()

    def probe(self, conn, args, ctx):
        return Fact(facts_command(ctx.host.base), parse_facts).gather(conn, timeout=60)

    def plan(self, facts, args, ctx):
        return Plan.noop(one_line(facts), **facts)
