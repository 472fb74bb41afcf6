"""Requirement policy per inventory profile, checked before anything is installed.

A profile names the hardware a host must have: `blackwell` (sm_120 RTX PRO 6000, sm_100 B200),
`hopper` (sm_90 H100/H200) or `cpu` (no GPU needed: the local demo). Checks compare the host
facts (`ops.gpu.facts.parse_host`) with the profile and its pins: compute capability, a driver new
enough for the pinned CUDA build, free disk for the venv and the models, a supported Python.
Each failure is ONE line: what is wrong on which host, then "(fix: ...)".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ops.errors import did_you_mean
from ops.gpu.pins import ProfilePins

GB = 1e9


@dataclass(frozen=True)
class Profile:
    name: str
    capabilities: tuple[str, ...]  # "MAJOR.MINOR" as nvidia-smi's compute_cap prints it
    needs_gpu: bool


PROFILES = {
    "blackwell": Profile("blackwell", ("12.0", "10.0"), True),
    "hopper": Profile("hopper", ("9.0",), True),
    "cpu": Profile("cpu", (), False),
}

# CUDA build -> (oldest driver branch that supports it, its CUDA version). Blackwell needs >= 12.8.
DRIVER_FOR_BUILD = {
    "cu126": (560, "12.6"),
    "cu128": (570, "12.8"),
    "cu129": (575, "12.9"),
    "cu130": (580, "13.0"),
}


def sm(cap: str) -> str:
    """ "12.0" -> "sm_120"."""
    return "sm_" + cap.replace(".", "")


def profile_named(name: Any) -> Profile:
    """The profile an inventory names; an unknown name is a one-line ValueError with the fix."""
    if isinstance(name, str) and name in PROFILES:
        return PROFILES[name]
    if name in ("", None):
        raise ValueError(
            f"the host has no profile (fix: set vars.profile in the inventory to one of "
            f"{', '.join(PROFILES)})"
        )
    close = did_you_mean(name, PROFILES)
    hint = f"{close} " if close else ""
    raise ValueError(
        f"unknown profile {str(name)!r} (fix: {hint}set the host's vars.profile in the inventory "
        f"to one of {', '.join(PROFILES)})"
    )


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".") if part.isdigit())


def check_gpu(host: str, profile: Profile, pins: ProfilePins, nvidia: dict[str, Any]) -> list[str]:
    """Driver present, every GPU's capability allowed, driver new enough for the CUDA build."""
    if not profile.needs_gpu:
        return []
    minimum, build_cuda = DRIVER_FOR_BUILD.get(pins.cuda, (0, ""))
    if not nvidia["present"]:
        return [
            f"no NVIDIA GPU/driver on {host}: {nvidia['error']} (fix: install the NVIDIA driver "
            f"R{minimum}+ until `nvidia-smi` lists the GPUs, or set profile: cpu for a host without a GPU)"
        ]
    failures = []
    wanted = " or ".join(sm(c) for c in profile.capabilities)
    groups: dict[tuple[str, str], list[int]] = {}
    for gpu in nvidia["gpus"]:
        if gpu["compute_cap"] not in profile.capabilities:
            groups.setdefault((gpu["name"], gpu["compute_cap"]), []).append(gpu["index"])
    for (name, cap), indexes in groups.items():
        which = f"GPU {indexes[0]}" if len(indexes) == 1 else f"GPUs {','.join(map(str, indexes))}"
        fitting = [p.name for p in PROFILES.values() if cap in p.capabilities]
        fix = (
            f"set the host's profile to '{fitting[0]}' in the inventory"
            if fitting
            else f"use a host with {wanted}; specops supports {', '.join(sm(c) for p in PROFILES.values() for c in p.capabilities)}"
        )
        verb = "is" if len(indexes) == 1 else "are"
        failures.append(
            f"{host}: {which} ({name}) {verb} {sm(cap)}, profile '{profile.name}' needs {wanted} (fix: {fix})"
        )
    driver = nvidia["driver"] or ""
    major = _version_tuple(driver)[:1]
    too_old = bool(major) and major[0] < minimum
    cuda = nvidia.get("cuda")
    if cuda and build_cuda and _version_tuple(cuda) < _version_tuple(build_cuda):
        too_old = True
    if too_old:
        supports = f" (supports CUDA {cuda})" if cuda else ""
        failures.append(
            f"{host}: driver {driver}{supports} is too old for the {pins.cuda} build pinned for "
            f"profile '{profile.name}', which needs R{minimum}+ (fix: install driver R{minimum} "
            f"or newer, or pin an older CUDA build in playbooks/pins.yaml)"
        )
    return failures


def check_disk(host: str, disk: dict[str, Any], need_gb: float, what: str) -> list[str]:
    """Enough free bytes on the filesystem that will hold the base directory."""
    if "error" in disk:
        return [
            f"{host}: cannot read free disk at the base directory: {disk['error']} "
            f"(fix: check that the base path is valid and `df` works)"
        ]
    free_gb = disk["free_bytes"] / GB
    if free_gb >= need_gb:
        return []
    return [
        f"{host}: {free_gb:.1f} GB free on {disk['mount']} (holding {disk['path']}), {need_gb:.1f} GB "
        f"needed for {what} (fix: free disk space, or set the host's base to a larger filesystem)"
    ]


def check_python(host: str, pins: ProfilePins, version: str | None, which: str) -> list[str]:
    """The interpreter that makes (or made) the venv is in the pinned range."""
    low, high = pins.python_min, pins.python_max
    span = f"{low[0]}.{low[1]}..{high[0]}.{high[1]}"
    if version is None:
        return [
            f"{host}: no {which} found (fix: install Python {span} with its venv module, "
            f"e.g. apt-get install python3 python3-venv, or set the host's python var)"
        ]
    if low <= _version_tuple(version)[:2] <= high:
        return []
    return [
        f"{host}: {which} is Python {version}, profile '{pins.profile}' supports {span} (fix: install a "
        f"supported Python and set the host's python var to it, or recreate the venv with it)"
    ]


def check(
    host: str,
    profile: Profile,
    pins: ProfilePins,
    facts: dict[str, Any],
    *,
    need_gb: float,
    need_what: str,
    python: str | None,
    python_which: str,
) -> list[str]:
    """Every failure of the host against its profile, in the order a human would fix them."""
    return [
        *check_gpu(host, profile, pins, facts["nvidia"]),
        *check_python(host, pins, python, python_which),
        *check_disk(host, facts["disk"], need_gb, need_what),
    ]
