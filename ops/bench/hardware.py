"""The hardware a result was measured on: GPU, driver, CUDA and the venv's torch (a fact)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ops.api.changes import Fact
from ops.shell import join

if TYPE_CHECKING:
    from ops.connection import CommandResult

_HW = (
    "nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader 2>/dev/null; "
    "nvidia-smi 2>/dev/null | grep -o 'CUDA Version: [0-9.]*'; echo '--'; "
    "{python} -c 'import importlib.metadata as m; print(m.version(\"torch\"))' 2>/dev/null; true"
)


def hardware_fact(python: str) -> Fact[dict[str, Any]]:
    """GPU name/compute capability/driver and the venv's torch version (empty on a CPU host)."""
    return Fact(_HW.format(python=join([python])), parse_hardware)


def parse_hardware(result: CommandResult) -> dict[str, Any]:
    """Pure parser of :func:`hardware_fact` (CUDA is the driver's, from the nvidia-smi banner)."""
    gpus_text, _, torch_text = result.stdout.partition("--")
    gpus = [[p.strip() for p in line.split(",")] for line in gpus_text.splitlines() if line.count(",") >= 2]
    first = gpus[0] if gpus else [None, None, None]
    cuda = [
        line.split(":", 1)[1].strip() for line in gpus_text.splitlines() if line.startswith("CUDA Version:")
    ]
    return {
        "gpu_name": first[0],
        "gpu_count": len(gpus) or None,
        "compute_cap": first[1],
        "driver": first[2],
        "cuda": cuda[0] if cuda else None,
        "torch": torch_text.strip().splitlines()[-1] if torch_text.strip() else None,
    }
