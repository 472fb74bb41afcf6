"""Read the GPU facts through a connection: the glue between `ops.gpu.facts` and the steps.

Shared by the gpu, pins and models steps, so each probes the host the same way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ops.api.changes import StepFailed
from ops.gpu import facts as gpu_facts
from ops.shell import join

if TYPE_CHECKING:
    from ops.connection import Connection


def gather_host(conn: Connection, base: str, python: str, venv: str) -> dict[str, Any]:
    """GPU, driver, CUDA, disk, OS, the host's and the venv's Python: one round trip."""
    result = conn.run(gpu_facts.host_command(base, python, venv), timeout=60)
    try:
        host = gpu_facts.parse_host(result.stdout)
    except gpu_facts.FactError as exc:
        raise StepFailed(
            f"cannot read GPU facts: {exc}", command=result.command, stderr=result.stderr
        ) from None
    return host


def gather_env(conn: Connection, venv: str) -> dict[str, Any] | None:
    """The venv's package versions and what its torch sees; None when the venv does not exist."""
    python = f"{venv}/bin/python"
    if conn.stat(python) is None:
        return None
    result = conn.run(join([python, "-"]), stdin=gpu_facts.probe_script(), timeout=180)
    if not result.ok:
        raise StepFailed(f"the Python probe failed in {venv}", command=result.command, stderr=result.stderr)
    try:
        return gpu_facts.parse_probe(result.stdout)
    except gpu_facts.FactError as exc:
        raise StepFailed(str(exc), command=result.command, stderr=result.stderr) from None
