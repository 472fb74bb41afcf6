"""The version pins (`playbooks/pins.yaml`): load, validate, and compare with what is installed.

A requirement is `name==version` or `name @ git+URL@REF` (a pull-request branch or a commit: the
DFlash support the product needed lived on a vLLM PR branch). Installed versions come from the
venv's package metadata; a git install is recognised by its `direct_url.json`, so a re-run with
the same ref installs nothing. A branch ref is compared by name: pin a commit to follow exactly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ops.errors import InputFileError

CUDA_BUILDS = ("cu126", "cu128", "cu129", "cu130", "cpu")
_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_EXTRAS = r"(?:\[[A-Za-z0-9,._ -]*\])?"
_PINNED = re.compile(rf"^(?P<name>{_NAME}){_EXTRAS}\s*==\s*(?P<version>[A-Za-z0-9.+!_-]+)$")
# The ref is whatever follows the LAST "@" (refs may hold "/": refs/pull/40898/head).
_GIT = re.compile(rf"^(?P<name>{_NAME}){_EXTRAS}\s*@\s*git\+(?P<url>[a-z+]+://\S+)@(?P<ref>[^\s@#]+)$")


def normalize(name: str) -> str:
    """PEP 503 name: `Flashinfer_Python` == `flashinfer-python`."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Requirement:
    """One pin: the pip argument, the normalized name, and either a version or a git url + ref."""

    spec: str
    name: str
    version: str | None = None
    git_url: str | None = None
    git_ref: str | None = None


def parse_requirement(text: str) -> Requirement:
    """`name==version` or `name @ git+URL@REF`; anything looser would make the probe guess."""
    text = " ".join(str(text).split())
    if match := _PINNED.match(text):
        return Requirement(text.replace(" ", ""), normalize(match["name"]), version=match["version"])
    if match := _GIT.match(text):
        return Requirement(text, normalize(match["name"]), git_url=match["url"], git_ref=match["ref"])
    raise ValueError(f"requirement {text!r} is neither 'name==version' nor 'name @ git+URL@REF'")


def _same_repo(a: str, b: str) -> bool:
    def canon(url: str) -> str:
        return url.removeprefix("git+").removesuffix("/").removesuffix(".git").lower()

    return canon(a) == canon(b)


def check_installed(req: Requirement, installed: dict[str, Any]) -> str | None:
    """None when `installed` (the probe's packages) satisfies `req`, else why not, e.g. "vllm 0.33.0 -> 0.34.0"."""
    info = installed.get(req.name)
    have = info["version"] if info else None
    if req.version is not None:
        wanted_local = "+" in req.version
        if have is not None and (have if wanted_local else have.split("+", 1)[0]) == req.version:
            return None
        return f"{req.name} {have or 'absent'} -> {req.version}"
    vcs = ((info or {}).get("direct_url") or {}).get("vcs_info") or {}
    url = ((info or {}).get("direct_url") or {}).get("url", "")
    ref = req.git_ref or ""
    same_ref = vcs.get("requested_revision") == ref or (
        len(ref) >= 7
        and re.fullmatch(r"[0-9a-f]+", ref) is not None
        and vcs.get("commit_id", "").startswith(ref)
    )
    if info and vcs.get("vcs") == "git" and _same_repo(url, req.git_url or "") and same_ref:
        return None
    now = (
        f"{have} from git@{vcs.get('requested_revision') or vcs.get('commit_id', '?')[:12]}" if vcs else have
    )
    target = f"git@{ref}" if not vcs or _same_repo(url, req.git_url or "") else f"{req.git_url}@{ref}"
    return f"{req.name} {now or 'absent'} -> {target}"


@dataclass(frozen=True)
class ProfilePins:
    """One profile's pins: CUDA build, package index, Python range, disk need and requirement sets."""

    profile: str
    cuda: str
    index: str | None
    python_min: tuple[int, int]
    python_max: tuple[int, int]
    venv_gb: float
    sets: dict[str, tuple[Requirement, ...]]

    def requirements(self, set_name: str | None = None) -> tuple[Requirement, ...]:
        """The named set (None: the first); an unknown name is a ValueError naming the known ones."""
        if set_name is None:
            return next(iter(self.sets.values()))
        if set_name not in self.sets:
            raise ValueError(
                f"profile '{self.profile}' has no pin set '{set_name}' (known: {', '.join(self.sets)})"
            )
        return self.sets[set_name]


def _minor(value: Any, where: str, path: Path) -> tuple[int, int]:
    match = re.fullmatch(r"(\d+)\.(\d+)", str(value))
    if not match:
        raise InputFileError(
            path, None, f"{where} is {value!r}, not MAJOR.MINOR", 'write it quoted, e.g. "3.11"'
        )
    return int(match[1]), int(match[2])


def load_pins(path: str | Path) -> dict[str, ProfilePins]:
    """Read and validate the pins file; every problem names the file and the key."""
    path = Path(path)
    data = _read_yaml(path)
    profiles = data.get("profiles") if isinstance(data, dict) else None
    if not isinstance(profiles, dict) or not profiles:
        raise InputFileError(path, None, "no 'profiles' mapping", "see the comment at the top of pins.yaml")
    return {str(name): _profile(path, name, body) for name, body in profiles.items()}


def _read_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except OSError as exc:
        raise InputFileError(path, None, f"cannot read the pins file: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise InputFileError(path, mark.line + 1 if mark else None, f"invalid YAML: {exc}") from None


def _profile(path: Path, name: Any, body: Any) -> ProfilePins:
    """One ``profiles.NAME`` entry, validated."""
    where = f"profiles.{name}"
    if not isinstance(body, dict):
        raise InputFileError(path, None, f"{where} must be a mapping")
    unknown = sorted(set(body) - {"cuda", "index", "python", "venv_gb", "sets"})
    if unknown:
        raise InputFileError(
            path,
            None,
            f"{where}: unknown key '{unknown[0]}'",
            "keys are cuda, index, python, venv_gb, sets",
        )
    if body.get("cuda") not in CUDA_BUILDS:
        raise InputFileError(
            path, None, f"{where}.cuda is {body.get('cuda')!r}", f"use one of {', '.join(CUDA_BUILDS)}"
        )
    python = body.get("python")
    if not isinstance(python, dict) or set(python) != {"min", "max"}:
        raise InputFileError(path, None, f'{where}.python must be {{min: "3.X", max: "3.Y"}}')
    sets = _requirement_sets(path, where, body.get("sets"))
    venv_gb = body.get("venv_gb", 0)
    if isinstance(venv_gb, bool) or not isinstance(venv_gb, (int, float)) or venv_gb < 0:
        raise InputFileError(path, None, f"{where}.venv_gb is {venv_gb!r}", "a number of GB, e.g. 25")
    return ProfilePins(
        profile=str(name),
        cuda=body["cuda"],
        index=body.get("index"),
        python_min=_minor(python["min"], f"{where}.python.min", path),
        python_max=_minor(python["max"], f"{where}.python.max", path),
        venv_gb=float(venv_gb),
        sets=sets,
    )


def _requirement_sets(path: Path, where: str, sets: Any) -> dict[str, tuple[Requirement, ...]]:
    """A profile's ``sets``: at least one named, non-empty list of exact pins."""
    if not isinstance(sets, dict) or not sets:
        raise InputFileError(path, None, f"{where}.sets must name at least one requirement list")
    parsed = {}
    for set_name, items in sets.items():
        if not isinstance(items, list) or not items:
            raise InputFileError(path, None, f"{where}.sets.{set_name} must be a non-empty list")
        try:
            parsed[str(set_name)] = tuple(parse_requirement(item) for item in items)
        except ValueError as exc:
            raise InputFileError(
                path,
                None,
                f"{where}.sets.{set_name}: {exc}",
                "pin exactly: name==version or name @ git+URL@REF",
            ) from None
    return parsed
